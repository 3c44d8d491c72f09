"""Thin adapters that run gapo's losses inside distributed engines (verl, TRL); see docs/scale-out.md."""
