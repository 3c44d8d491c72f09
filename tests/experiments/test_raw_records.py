"""gapo.experiments.raw_records: a grid's raw records packed without checkpoints or logs, and
restored only inside the destination."""

import io
import tarfile

import pytest

from gapo.experiments.raw_records import main, pack, unpack


def test_pack_and_unpack_keep_only_the_raw_records(tmp_path):
    runs = tmp_path / "runs"
    d = runs / "u32" / "gapo" / "seed0"
    d.mkdir(parents=True)
    for f in ("metrics.jsonl", "config.yaml", "done.json", "checkpoint.pt"):
        (d / f).write_text(f)
    (runs / "u32" / "gapo" / "seed0.json").write_text("{}")
    (runs / "u32" / "base_eval.json").write_text("{}")
    unfinished = runs / "u32" / "gapo" / "seed1"
    unfinished.mkdir()
    (unfinished / "metrics.jsonl").write_text("x")
    assert pack(runs, tmp_path / "new" / "raw.tar.xz") == 1  # its folder is made
    (tmp_path / "new" / "raw.tar.xz").rename(tmp_path / "raw.tar.xz")
    unpack(tmp_path / "raw.tar.xz", tmp_path / "back")
    got = sorted(str(p.relative_to(tmp_path / "back")) for p in (tmp_path / "back").rglob("*") if p.is_file())
    assert got == [
        "u32/base_eval.json",
        "u32/gapo/seed0.json",
        "u32/gapo/seed0/config.yaml",
        "u32/gapo/seed0/done.json",
        "u32/gapo/seed0/metrics.jsonl",
    ]
    # a hostile archive (a member outside the destination) is refused
    bad = tmp_path / "bad.tar"
    with tarfile.open(bad, "w") as tar:
        info = tarfile.TarInfo("../evil.txt")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))
    with pytest.raises(tarfile.TarError):
        unpack(bad, tmp_path / "back2")
    assert not (tmp_path / "evil.txt").exists()
    with pytest.raises(ValueError, match="does not exist"):
        unpack(tmp_path / "nope.tar.xz", tmp_path / "x")


def test_the_command_packs_and_names_a_missing_folder(tmp_path, capsys):
    assert main(["pack", str(tmp_path / "nope"), str(tmp_path / "a.tar.xz")]) == 2
    assert "is not a folder" in capsys.readouterr().err
    (tmp_path / "runs").mkdir()
    assert main(["pack", str(tmp_path / "runs"), str(tmp_path / "a.tar.xz")]) == 0
    assert capsys.readouterr().out.startswith("0 cells -> ")
