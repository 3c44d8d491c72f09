"""verl start-up with GAPO (issue 12): the plugin's loading in fresh processes, the documented
``main_ppo`` commands, ``+policy_loss.*`` keys without a ``_target_`` override, start-up errors in
gapo's words, and the packages verl's default trainer imports.

The two launch commands are read from docs/scale-out.md, so the docs and these tests cannot
drift apart. Nothing here starts Ray.
"""

from __future__ import annotations

import copy
import functools
import json
import os
import pickle
import re
import shlex
import sys
import textwrap
from pathlib import Path

import pytest
from _forked import run_cases  # tests/integrations/_forked.py: fresh children of one preloaded interpreter

import timing  # tests/timing.py: timeouts that say they are timeouts

pytest.importorskip("verl")

import verl  # noqa: E402
from hydra import compose, initialize_config_dir  # noqa: E402
from hydra._internal.config_loader_impl import ConfigLoaderImpl  # noqa: E402
from hydra.core.override_parser.overrides_parser import OverridesParser  # noqa: E402
from hydra.errors import InstantiationException  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402
from verl.utils.config import omega_conf_to_dataclass, validate_config  # noqa: E402
from verl.workers.config import PolicyLossConfig  # noqa: E402

import gapo.integrations.verl as gv  # noqa: E402
from gapo.integrations.verl import GAPOPolicyLossConfig  # noqa: E402
from gapo.integrations.verl_config import reward_range_of  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs" / "scale-out.md"
CONF_DIR = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
PL = "actor_rollout_ref.actor.policy_loss"

# what a minimal run needs besides the override under test
BASE = [
    "data.train_files=/d/train.parquet",
    "data.val_files=/d/val.parquet",
    "actor_rollout_ref.model.path=/m",
    "actor_rollout_ref.rollout.n=4",
    "data.train_batch_size=8",
    "actor_rollout_ref.actor.ppo_mini_batch_size=4",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
    "trainer.n_gpus_per_node=1",
]


# ---------------------------------------------------------------------------------------------
# the documented commands


def doc_scripts() -> dict[str, str]:
    """The bash blocks of the verl section that run ``main_ppo``, by their ``loss_mode``."""
    text = DOCS.read_text()
    section = text[text.index("\n## verl\n") : text.index("\n## TRL\n")]
    blocks = re.findall(r"```bash\n(.*?)```", section, flags=re.S)
    scripts = [b for b in blocks if "python3 -m verl.trainer.main_ppo" in b]
    modes = [re.search(rf"{PL}\.loss_mode=(\w+)", b).group(1) for b in scripts]
    assert sorted(modes) == ["gapo", "gapo_seq"], modes  # exactly one command per loss mode
    return dict(zip(modes, scripts))


def doc_overrides(script: str, env: dict | None = None) -> list[str]:
    """The Hydra overrides of a documented script, shell variables filled in as its defaults do."""
    env = {"PWD": "/work", **(env or {})}
    for name, default in re.findall(r"^(\w+)=\$\{\1:-(.*)\}$", script, flags=re.M):
        env.setdefault(name, re.sub(r"\$(\w+)", lambda m: env[m.group(1)], default))
    cmd = script[script.index("python3 -m verl.trainer.main_ppo") :]
    cmd = cmd[: cmd.index('"$@"')].replace("\\\n", " ")
    cmd = re.sub(r"\$(\w+)", lambda m: env[m.group(1)], cmd)  # leaves '${algorithm.*}' alone
    return shlex.split(cmd)[3:]


def _hydra_compose(overrides):
    """verl's ppo_trainer config with ``overrides``, composed by hydra from the files (~0.8 s of CPU)."""
    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
        return compose("ppo_trainer", overrides=list(overrides))


@functools.cache
def _plain_config():
    return _hydra_compose([])


def _compose(overrides):
    """The same config as :func:`_hydra_compose`, from one composition of the files shared by the
    module: a copy of ppo_trainer without overrides, then the overrides applied by the function
    hydra's compose applies them with (after the defaults list, in struct mode). Exact for
    overrides of config values (``key=v``, ``+key=v``, interpolations), the only kind used here
    (no config-group choices, which would change the defaults list): checked against hydra's own
    composition by test_shared_composition_is_hydras."""
    parsed = OverridesParser.create().parse_overrides(list(overrides))
    assert all(o.package is None and "/" not in o.key_or_group for o in parsed), overrides  # no group choices
    cfg = copy.deepcopy(_plain_config())
    ConfigLoaderImpl._apply_overrides_to_config(parsed, cfg)
    return cfg


@pytest.mark.parametrize(
    "overrides",
    [
        pytest.param(lambda: doc_overrides(doc_scripts()["gapo"]), id="docs-gapo"),
        pytest.param(lambda: BASE + [f"{PL}.loss_mode=gapo", f"+{PL}.reward_range=[-1,1]"], id="list"),
    ],
)
def test_shared_composition_is_hydras(overrides):
    """:func:`_compose` (what the tests below compose with) gives exactly hydra's composition:
    the documented command (plain values, ``+`` keys, interpolations, a list) and a ``+`` list."""
    overrides = overrides()
    ours, hydra = _compose(overrides), _hydra_compose(overrides)
    assert OmegaConf.to_yaml(ours) == OmegaConf.to_yaml(hydra)
    assert OmegaConf.to_container(ours, resolve=True) == OmegaConf.to_container(hydra, resolve=True)
    assert OmegaConf.is_struct(ours) and OmegaConf.is_struct(hydra)
    assert OmegaConf.to_yaml(ours) != OmegaConf.to_yaml(_plain_config())  # the overrides did something


def _expected(override, cfg):
    """The value an override should leave in the composed (resolved) config."""
    value = override.value()
    if isinstance(value, str) and value.startswith("${") and value.endswith("}"):
        return OmegaConf.select(cfg, value[2:-1])
    return value


def _same(a, b) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return isinstance(a, (int, float)) and isinstance(b, (int, float)) and abs(a - b) <= 1e-12 * max(1, abs(b))
    return a == b


def check_every_override(overrides, cfg, actor):
    """Each override is in the composed config with its value, and each one under
    ``actor_rollout_ref.actor`` is in the dataclass verl's workers build from it."""
    parsed = OverridesParser.create().parse_overrides(overrides)
    assert len(parsed) == len(overrides)
    checked_in_dataclass = []
    for o in parsed:
        key, want = o.key_or_group, _expected(o, cfg)
        got = OmegaConf.select(cfg, key, throw_on_missing=True)
        got = OmegaConf.to_container(got) if OmegaConf.is_config(got) else got
        assert _same(got, want), (key, got, want)
        if key.startswith("actor_rollout_ref.actor."):
            obj = actor
            for part in key.split(".")[2:]:
                obj = getattr(obj, part)
            assert _same(obj, want), (key, obj, want)
            checked_in_dataclass.append(key)
    return checked_in_dataclass


@pytest.mark.parametrize("mode", ["gapo", "gapo_seq"])
def test_docs_command_composes_validates_and_instantiates_gapo(mode):
    """verl's real ppo_trainer config with the documented overrides passes verl's validate_config;
    every override arrives, in the config and in the actor dataclass (GAPO's fields included,
    without a _target_ override); the loss runs with it and spans the documented widths."""
    from test_verl import call, group_batch  # the verl test helpers (losses called as verl's actor calls them)

    script = doc_scripts()[mode]
    assert "_target_" not in script  # the shorthand is the documented way now
    overrides = doc_overrides(script)
    cfg = _compose(overrides)
    validate_config(cfg, use_reference_policy=False, use_critic=False)
    OmegaConf.resolve(cfg)  # as TaskRunnerV1.run does before building the workers
    act = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)  # as engine_workers.init_model does
    pl = act.policy_loss
    assert type(pl) is GAPOPolicyLossConfig and pl.loss_mode == mode
    in_dataclass = check_every_override(overrides, cfg, act)
    assert {f"{PL}.{k}" for k in ("loss_mode", "eps_high_max", "adv_estimator", "norm_adv_by_std_in_grpo")} <= set(
        in_dataclass
    )
    assert cfg.data.train_batch_size == 256 and cfg.actor_rollout_ref.rollout.n == 8
    lo, hi = {"gapo_seq": (3e-3, 5e-3), "gapo": (0.2, 0.28)}[mode]
    assert (act.clip_ratio_low, act.clip_ratio_high, pl.eps_high_max) == (lo, lo, hi)
    assert act.loss_agg_mode == {"gapo_seq": "seq-mean-token-mean", "gapo": "token-mean"}[mode]
    assert (pl.adv_estimator, pl.norm_adv_by_std_in_grpo) == ("grpo", False)  # interpolated from algorithm.*
    act = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)  # fresh copy for the loss call
    old, logp, adv, mask, rewards = group_batch(0, noise=0.02)
    _, grad, m = call(mode, old, logp, adv, mask, act)
    assert lo < m["actor/gapo_eps_high_mean"] < hi and grad.abs().sum() > 0


_CAPTURE = textwrap.dedent("""
    # stands in for `python3`: runs verl's real main_ppo entry point (hydra.main, auto_set_device,
    # validate_config) and, instead of starting Ray, what TaskRunnerV1.run and the actor worker do next
    import json, sys
    assert sys.argv[1:3] == ["-m", "verl.trainer.main_ppo"], sys.argv
    sys.argv = ["main_ppo.py"] + sys.argv[3:]
    import verl.trainer.main_ppo as main_ppo

    def run_ppo(config, task_runner_class):
        from omegaconf import OmegaConf
        import transfer_queue  # noqa: F401  (TaskRunnerV1.run)
        from verl.trainer.ppo.v1 import get_trainer_cls
        from verl.utils.config import omega_conf_to_dataclass
        trainer = get_trainer_cls(config.trainer.v1.trainer_mode)
        OmegaConf.resolve(config)
        actor = omega_conf_to_dataclass(config.actor_rollout_ref.actor)
        pl = actor.policy_loss
        print("GAPO_CAPTURE " + json.dumps({
            "trainer": trainer.__name__,
            "policy_loss_type": type(pl).__module__ + "." + type(pl).__qualname__,
            "policy_loss": {k: pl[k] for k in ("loss_mode", "eps_high_max", "eps_schedule", "reward_min",
                                               "reward_max", "adv_estimator", "norm_adv_by_std_in_grpo")},
            "clip": [actor.clip_ratio_low, actor.clip_ratio_high],
            "config": OmegaConf.to_container(config),
        }), flush=True)

    main_ppo.run_ppo = run_ppo
    main_ppo.main()
""")


# stands in for `python3` on the scripts' PATH: records how bash called it (arguments, environment,
# folder) for the replay below, in a second of CPU instead of a verl start-up per script
_RECORD = textwrap.dedent("""
    import json, os, sys
    with open(os.environ["GAPO_PYTHON3_CALLS"], "a") as f:
        f.write(json.dumps({"argv": sys.argv[1:], "cwd": os.getcwd(), "env": dict(os.environ)}) + "\\n")
""")

# a fresh `import verl`: which of verl's two mechanisms imports the adapter, and what is registered
_PROBE = textwrap.dedent("""
    import sys, traceback

    class _Spy:  # reports which of verl's two mechanisms imports the adapter
        def find_spec(self, name, path=None, target=None):
            if name == "gapo.integrations.verl":
                frames = [f.name for f in traceback.extract_stack()]
                how = "env_var" if "import_external_libs" in frames else "entry_point" if "load" in frames else "?"
                print("LOADED_BY", how)
            return None

    sys.meta_path.insert(0, _Spy())
    {pre}
    import verl
    from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY as R
    print("REGISTERED", sorted(k for k in ("gapo", "gapo_seq") if k in R),
          getattr(R.get("gapo"), "__module__", None))
    {post}
""")

# what main_ppo's start-up imports besides verl, gapo, ray and the default trainer's own packages
# (transfer_queue, fastapi, uvicorn, zmq, …, imported by the replay itself): loaded once, before the fork
MAIN_PPO_PRELOAD = [
    "torch",
    "tensordict",
    "transformers",
    "omegaconf",
    "hydra",
    "datasets",
    "pandas",
    "accelerate",
    "peft",
]


def _loading_cases():
    """The fresh `import verl` cases of test_loading_in_fresh_processes."""
    broken_post = textwrap.dedent("""
        try:
            R["gapo"]()
        except RuntimeError as e:
            print("STUB", e)
    """)

    def case(env_update, pre="", post=""):
        return {
            "code": _PROBE.format(pre=pre, post=post),
            "env_drop_prefixes": ["VERL_USE_EXTERNAL"],
            "env_update": env_update,
            "cwd": "/",
        }

    return {
        "entry_point": case({}),
        "env_var": case({"VERL_USE_EXTERNAL_PLUGINS": "none", "VERL_USE_EXTERNAL_MODULES": "gapo.integrations.verl"}),
        # the core cannot be imported: verl's loader alone would hide that at DEBUG level
        "broken": case({}, pre="sys.modules['gapo.core.losses'] = None", post=broken_post),
    }


@pytest.fixture(scope="module")
def fresh_processes(tmp_path_factory):
    """``({case: (exit status, stdout, stderr)}, tmp folder)``: the cases of
    test_loading_in_fresh_processes and, as ``gapo``/``gapo_seq``, the documented scripts' start-up.

    Both scripts run verbatim by bash with `python3` a recorder of its call; each recorded call is
    then replayed (its arguments, environment and folder) through verl's real main_ppo. Every case
    is a fresh process for verl and gapo: a forked child of one interpreter that has imported
    torch, transformers, hydra & co but not verl, gapo or ray (asserted;
    tests/integrations/_forked.py), so the first ``import verl``, the plugin's load and the default
    trainer's start-up imports are that child's."""
    tmp_path = tmp_path_factory.mktemp("fresh")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (tmp_path / "capture.py").write_text(_CAPTURE)
    (tmp_path / "record.py").write_text(_RECORD)
    shim = bin_dir / "python3"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -I -S "{tmp_path / "record.py"}" "$@"\n')
    shim.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VERL_USE_EXTERNAL", "MODEL", "DATA"))}
    cases = _loading_cases()
    for mode, script in doc_scripts().items():
        run_dir = tmp_path / mode
        run_dir.mkdir()
        (run_dir / "launch.sh").write_text(script)
        calls = run_dir / "python3-calls.jsonl"
        bash_env = {
            **env,
            "PATH": f"{bin_dir}:{env['PATH']}",
            "HYDRA_FULL_ERROR": "1",
            "GAPO_PYTHON3_CALLS": str(calls),
        }
        proc = timing.run(
            ["bash", "launch.sh", "trainer.logger=[console]"],
            cwd=run_dir,
            env=bash_env,
            capture_output=True,
            text=True,
            timeout=300,
            quiet_s=1,
            what=f"the documented {mode} script",
        )
        assert proc.returncode == 0, (mode, proc.stderr[-4000:])
        (call,) = [json.loads(line) for line in calls.read_text().splitlines()]  # python3 ran once
        assert call["cwd"] == str(run_dir)
        cases[mode] = {
            "code": _CAPTURE,
            "env": call["env"],
            "cwd": call["cwd"],
            "argv": [str(tmp_path / "capture.py"), *call["argv"]],
            "path0": str(tmp_path),
        }
    done = run_cases(
        MAIN_PPO_PRELOAD,
        ["verl", "gapo", "ray"],
        cases,
        tmp_path,
        env=env,
        timeout=1800,
        quiet_s=60,
        what="three fresh `import verl` and verl's main_ppo start-up (both scripts)",
    )
    return done, tmp_path


@pytest.mark.slow
def test_loading_in_fresh_processes(fresh_processes):
    """``import verl`` alone registers the losses through the entry point; with entry points off,
    ``VERL_USE_EXTERNAL_MODULES`` does; a failing import is loud (ERROR log, and stubs that raise
    the cause instead of verl's "Unsupported loss mode"). Each case is a process whose first
    ``import verl`` (and of gapo) is the probe's."""
    out = fresh_processes[0]
    ok = "REGISTERED ['gapo', 'gapo_seq'] gapo.integrations.verl"
    for how in ("entry_point", "env_var"):
        rc, stdout, stderr = out[how]
        assert rc == 0, (how, stderr[-4000:])
        assert ok in stdout and f"LOADED_BY {how}" in stdout, out[how]
        assert stdout.count("LOADED_BY") == 1, out[how]
    rc, stdout, stderr = out["broken"]
    assert rc == 0, stderr[-4000:]
    assert "gapo's verl plugin failed to load" in stderr, stderr
    assert "STUB gapo's verl plugin failed to load" in stdout, stdout


@pytest.mark.slow
def test_docs_scripts_start_main_ppo(fresh_processes):
    """Both documented scripts, run verbatim by bash, their `python3` call replayed in a fresh
    process that runs verl's main_ppo up to Ray (the fixture): the plugin loads through the entry
    point, the start-up imports of the default trainer succeed, and every override arrives."""
    done, tmp_path = fresh_processes
    for mode in doc_scripts():
        rc, stdout, stderr = done[mode]
        assert rc == 0, (mode, stderr[-4000:])
        line = [ln for ln in stdout.splitlines() if ln.startswith("GAPO_CAPTURE ")]
        assert len(line) == 1, (stdout[-2000:], stderr[-4000:])
        out = json.loads(line[0][len("GAPO_CAPTURE ") :])
        assert out["trainer"] == "PPOTrainerSync"
        assert out["policy_loss_type"] == "gapo.integrations.verl.GAPOPolicyLossConfig"
        lo, hi = {"gapo_seq": (3e-3, 5e-3), "gapo": (0.2, 0.28)}[mode]
        assert out["clip"] == [lo, lo]
        assert out["policy_loss"] == {
            "loss_mode": mode,
            "eps_high_max": hi,
            "eps_schedule": "linear",
            "reward_min": 0.0,
            "reward_max": 1.0,
            "adv_estimator": "grpo",
            "norm_adv_by_std_in_grpo": False,
        }
        cfg = OmegaConf.create(out["config"])
        overrides = doc_overrides(doc_scripts()[mode], env={"PWD": str(tmp_path / mode)})
        overrides.append("trainer.logger=[console]")  # "$@" of the script: extra overrides pass through
        last = {o.key_or_group: o for o in OverridesParser.create().parse_overrides(overrides)}  # last one wins
        assert len(last) == len(overrides) - 1  # only trainer.logger appears twice
        for o in last.values():
            got = OmegaConf.select(cfg, o.key_or_group, throw_on_missing=True)
            got = OmegaConf.to_container(got) if OmegaConf.is_config(got) else got
            assert _same(got, _expected(o, cfg)), (mode, o.key_or_group, got)
        assert cfg.trainer.logger == ["console"]
        assert cfg.actor_rollout_ref.model.path == "Qwen/Qwen2.5-Math-1.5B"  # the script's default


# ---------------------------------------------------------------------------------------------
# +policy_loss.* without _target_


@pytest.mark.parametrize("mode", ["gapo", "gapo_seq"])
def test_gapo_keys_work_without_target_override(mode):
    cfg = _compose(
        BASE
        + [
            f"{PL}.loss_mode={mode}",
            f"+{PL}.eps_high_max=0.28",
            f"+{PL}.eps_schedule=log",
            f"+{PL}.reward_min=-1",
            f"+{PL}.binary_rewards=false",
        ]
    )
    assert cfg.actor_rollout_ref.actor.policy_loss._target_ == "verl.workers.config.PolicyLossConfig"
    validate_config(cfg, use_reference_policy=False, use_critic=False)
    pl = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor).policy_loss
    assert type(pl) is GAPOPolicyLossConfig
    assert (pl.loss_mode, pl.eps_high_max, pl.eps_schedule, pl.reward_min, pl.binary_rewards) == (
        mode,
        0.28,
        "log",
        -1.0,
        False,
    )
    assert pl.rollout_correction == PolicyLossConfig().rollout_correction  # verl's own fields kept


def test_gapo_loss_mode_alone_gets_gapo_config_with_defaults():
    cfg = _compose(BASE + [f"{PL}.loss_mode=gapo"])
    pl = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor).policy_loss
    assert type(pl) is GAPOPolicyLossConfig
    assert (
        pl.eps_high_max,
        pl.eps_schedule,
        pl.reward_min,
        pl.reward_max,
        pl.adv_estimator,
        pl.norm_adv_by_std_in_grpo,
        pl.binary_rewards,
    ) == (None, "linear", 0.0, 1.0, "grpo", False, True)


def test_explicit_target_still_works():
    cfg = _compose(
        BASE
        + [
            f"{PL}.loss_mode=gapo_seq",
            f"{PL}._target_=gapo.integrations.verl.GAPOPolicyLossConfig",
            f"+{PL}.eps_high_max=5e-3",
        ]
    )
    pl = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor).policy_loss
    assert type(pl) is GAPOPolicyLossConfig and pl.eps_high_max == 5e-3


def test_other_loss_modes_are_untouched():
    pl = omega_conf_to_dataclass(_compose(BASE + [f"{PL}.loss_mode=gspo"]).actor_rollout_ref.actor).policy_loss
    assert type(pl) is PolicyLossConfig and pl.loss_mode == "gspo"
    assert type(PolicyLossConfig()) is PolicyLossConfig
    assert type(PolicyLossConfig(loss_mode="vanilla", clip_cov_ratio=0.1)) is PolicyLossConfig
    with pytest.raises(TypeError, match="unexpected keyword argument 'no_such_key'"):  # verl's own error
        PolicyLossConfig(loss_mode="vanilla", no_such_key=1)


def test_copies_and_pickles_keep_type_and_fields():
    pl = PolicyLossConfig(loss_mode="gapo_seq", eps_high_max=5e-3, eps_schedule="log")
    assert type(pl) is GAPOPolicyLossConfig
    for clone in (copy.deepcopy(pl), pickle.loads(pickle.dumps(pl)), copy.copy(pl)):
        assert type(clone) is GAPOPolicyLossConfig and clone == pl
    plain = PolicyLossConfig(loss_mode="gspo")
    assert type(pickle.loads(pickle.dumps(plain))) is PolicyLossConfig


def test_dispatch_install_is_idempotent():
    before = PolicyLossConfig.__dict__["__new__"]
    gv._install_config_dispatch()
    assert PolicyLossConfig.__dict__["__new__"] is before
    assert type(PolicyLossConfig(loss_mode="gapo")) is GAPOPolicyLossConfig


def test_install_uninstall_is_the_whole_patch_of_verl():
    """The import's patch of verl is install(): uninstall() gives verl back its own registry
    entries, PolicyLossConfig's construction (verl's own errors again) and
    ActorConfig.validate; install() re-applies all of it, and twice is once."""
    from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY
    from verl.workers.config import ActorConfig

    assert gv.installed()  # importing the module installed it
    try:
        gv.uninstall()
        assert not gv.installed()
        assert "gapo" not in POLICY_LOSS_REGISTRY and "gapo_seq" not in POLICY_LOSS_REGISTRY
        assert ActorConfig.__dict__["validate"].__qualname__ == "ActorConfig.validate"  # verl's own
        with pytest.raises(TypeError, match="unexpected keyword argument 'eps_high_max'"):  # verl's own error
            PolicyLossConfig(loss_mode="gapo", eps_high_max=0.28)
        assert type(PolicyLossConfig(loss_mode="vanilla")) is PolicyLossConfig
        gv.uninstall()  # idempotent
    finally:
        gv.install()
        gv.install()
    assert gv.installed()
    assert POLICY_LOSS_REGISTRY["gapo"] is gv.compute_policy_loss_gapo
    assert type(PolicyLossConfig(loss_mode="gapo", eps_high_max=0.28)) is GAPOPolicyLossConfig
    assert gv._actor_validate.verl.__qualname__ == "ActorConfig.validate"  # not a wrapper of the wrapper


# ---------------------------------------------------------------------------------------------
# start-up errors in gapo's words


def _startup_error(extra):
    cfg = _compose(BASE + extra)
    with pytest.raises(InstantiationException) as info:
        validate_config(cfg, use_reference_policy=False, use_critic=False)
    return str(info.value)


def test_gapo_key_with_another_loss_mode_names_the_fix():
    msg = _startup_error([f"{PL}.loss_mode=vanilla", f"+{PL}.eps_high_max=0.28"])
    assert "GAPO's field(s) ['eps_high_max'] but loss_mode='vanilla'" in msg
    assert "policy_loss.loss_mode=gapo or gapo_seq" in msg


def test_misspelt_gapo_key_lists_gapo_keys():
    msg = _startup_error([f"{PL}.loss_mode=gapo", f"+{PL}.eps_hihg_max=0.28"])
    assert "unknown key(s) ['eps_hihg_max']" in msg
    for name in gv.GAPO_FIELDS:
        assert repr(name) in msg


def test_renamed_gapo_key_names_the_new_one():
    # gapo 0.3 spells the ε schedule eps_schedule everywhere (algo.eps_schedule, TRL's GAPOConfig)
    msg = _startup_error([f"{PL}.loss_mode=gapo", f"+{PL}.schedule=log"])
    assert "policy_loss.schedule is now policy_loss.eps_schedule" in msg


@pytest.mark.parametrize(
    "extra, match",
    [
        ([f"+{PL}.eps_schedule=cosine"], "policy_loss.eps_schedule must be one of"),
        ([f"+{PL}.reward_min=1", f"+{PL}.reward_max=0"], r"policy_loss.reward_max \(0.0\) must be > reward_min"),
        ([f"+{PL}.adv_estimator=gae"], "policy_loss.adv_estimator='gae'"),
    ],
)
def test_invalid_gapo_values_fail_at_startup(extra, match):
    msg = _startup_error([f"{PL}.loss_mode=gapo"] + extra)
    assert re.search(match, msg), msg


INTERP = [
    f"+{PL}.adv_estimator=${{algorithm.adv_estimator}}",
    f"+{PL}.norm_adv_by_std_in_grpo=${{algorithm.norm_adv_by_std_in_grpo}}",
]


@pytest.mark.parametrize("mode", ["group", "batch"])
def test_reward_range_group_batch_at_startup(mode):
    """Accepted with std-normalised GRPO (the estimator settings interpolated from algorithm.*),
    rejected at start-up under Dr.GRPO with gapo's explanation."""
    ok = _compose(
        BASE
        + INTERP
        + [
            "algorithm.adv_estimator=grpo",
            "algorithm.norm_adv_by_std_in_grpo=True",
            f"{PL}.loss_mode=gapo_seq",
            f"+{PL}.reward_range={mode}",
        ]
    )
    validate_config(ok, use_reference_policy=False, use_critic=False)
    OmegaConf.resolve(ok)
    pl = omega_conf_to_dataclass(ok.actor_rollout_ref.actor).policy_loss
    assert (type(pl), pl.reward_range, pl.norm_adv_by_std_in_grpo) == (GAPOPolicyLossConfig, mode, True)
    msg = _startup_error(
        INTERP
        + [
            "algorithm.adv_estimator=grpo",
            "algorithm.norm_adv_by_std_in_grpo=False",
            f"{PL}.loss_mode=gapo",
            f"+{PL}.reward_range={mode}",
        ]
    )
    assert f"policy_loss.reward_range={mode!r}" in msg and "norm_adv_by_std_in_grpo=False" in msg
    assert "policy_loss.reward_min/reward_max" in msg


def test_reward_range_fixed_list_at_startup():
    cfg = _compose(BASE + [f"{PL}.loss_mode=gapo", f"+{PL}.reward_range=[-1,1]"])
    validate_config(cfg, use_reference_policy=False, use_critic=False)
    pl = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor).policy_loss
    assert list(pl.reward_range) == [-1, 1] and reward_range_of(pl) == (-1.0, 1.0)


def test_gapo_fields_are_the_documented_ones():
    text = DOCS.read_text()
    section = text[text.index("\n## verl\n") : text.index("\n## TRL\n")]
    for name in gv.GAPO_FIELDS:
        assert f"`+policy_loss.{name}`" in section or f"+policy_loss.{name}`" in section, name


# ---------------------------------------------------------------------------------------------
# what main_ppo imports at start-up, and the `verl` extra that installs it

STARTUP_MODULES = [
    "transfer_queue",
    "cachetools",
    "fastapi",
    "uvicorn",
    "zmq",
    "msgspec",
    "verl.trainer.main_ppo",
    "verl.trainer.main_ppo_v0",
    "verl.trainer.ppo.v1",
    "verl.trainer.ppo.ray_trainer",
    "verl.workers.engine_workers",
    "verl.workers.rollout.router",
    "verl.workers.rollout.utils",
    "verl.experimental.agent_loop",
    "verl.experimental.reward_loop",
]


@pytest.mark.parametrize("module", STARTUP_MODULES)
def test_main_ppo_startup_modules_import(module):
    import importlib

    importlib.import_module(module)


def _requirement_names(reqs):
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    return {canonicalize_name(Requirement(r).name): Requirement(r) for r in reqs}


def test_verl_extra_installs_what_the_default_trainer_imports():
    tomllib = pytest.importorskip("tomllib")
    from importlib.metadata import packages_distributions, requires

    from packaging.utils import canonicalize_name

    extra = _requirement_names(
        tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["verl"]
    )
    assert str(extra["verl"].specifier) == "==0.9.1"
    # the distributions that provide the modules verl's default trainer imports but verl does not require
    dists = packages_distributions()
    for module in ("transfer_queue", "cachetools", "fastapi", "uvicorn"):
        names = {canonicalize_name(d) for d in dists.get(module, [])}
        assert names & set(extra), (module, names)
    # each is one of verl's own `verl-core` requirements, with a specifier verl's accepts
    core = {}
    for r in requires("verl"):
        if 'extra == "verl-core"' in r:
            req = _requirement_names([r.split(";")[0]])
            core.update(req)
    for name in extra:
        if name != "verl":
            assert name in core, name
    # and every new package (with the dependencies they bring that verl's base does not) is pinned
    lock = {}
    for line in (ROOT / "requirements" / "lock.txt").read_text().splitlines():
        if "==" in line and not line.startswith("#"):
            name, version = line.split("==", 1)
            lock[canonicalize_name(name)] = version.strip()
    for name in list(extra) + ["pyzmq", "msgspec", "starlette"]:
        assert name in lock, name
        assert extra.get(name) is None or extra[name].specifier.contains(lock[name]), (name, lock[name])


@pytest.mark.parametrize(
    "extra, match",
    [
        # ε_high_max below clip_ratio_low: explicit, and through clip_ratio_high when eps_high_max is unset
        (
            [
                f"+{PL}.eps_high_max=0.1",
                "actor_rollout_ref.actor.clip_ratio_low=0.2",
                "actor_rollout_ref.actor.clip_ratio_high=0.2",
            ],
            r"eps_high_max \(0.1, from policy_loss.eps_high_max\) >= clip_ratio_low \(0.2, actor.clip_ratio_low\)",
        ),
        (
            ["actor_rollout_ref.actor.clip_ratio_low=0.2", "actor_rollout_ref.actor.clip_ratio_high=0.1"],
            r"eps_high_max \(0.1, from actor.clip_ratio_high .*\) >= clip_ratio_low \(0.2, ",
        ),
        # a clip_ratio_high that is neither clip_ratio_low nor eps_high_max
        (
            [
                f"+{PL}.eps_high_max=0.28",
                "actor_rollout_ref.actor.clip_ratio_low=0.2",
                "actor_rollout_ref.actor.clip_ratio_high=0.25",
            ],
            "ambiguous GAPO clip range",
        ),
        # a group of one: no group success to adapt to
        (["actor_rollout_ref.rollout.n=1"], r"rollout_n \(the group size G\) >= 2, got 1"),
    ],
)
@pytest.mark.parametrize("mode", ["gapo", "gapo_seq"])
def test_invalid_actor_combinations_fail_in_validate_config(mode, extra, match):
    """The three settings only the whole actor config can judge stop verl's validate_config (the
    driver, before Ray and the rollout engine start), not the first loss call; the message names
    the loss mode and the verl keys."""
    cfg = _compose(BASE + [f"{PL}.loss_mode={mode}"] + extra)
    with pytest.raises(ValueError, match=match) as info:
        validate_config(cfg, use_reference_policy=False, use_critic=False)
    assert f"policy_loss.loss_mode={mode}" in str(info.value)


def test_actor_validation_leaves_other_loss_modes_and_valid_gapo_alone():
    # vanilla PPO with an asymmetric clip range and n=1 is verl's business, not gapo's
    vanilla = _compose(
        BASE
        + [
            "actor_rollout_ref.rollout.n=1",
            "actor_rollout_ref.actor.clip_ratio_low=0.2",
            "actor_rollout_ref.actor.clip_ratio_high=0.1",
        ]
    )
    validate_config(vanilla, use_reference_policy=False, use_critic=False)
    for extra in (
        [f"+{PL}.eps_high_max=0.28"],  # clip_ratio_high (= clip_ratio 0.2) = clip_ratio_low
        ["actor_rollout_ref.actor.clip_ratio_high=0.28"],
    ):  # eps_high_max unset: clip_ratio_high
        ok = _compose(BASE + [f"{PL}.loss_mode=gapo"] + extra)
        validate_config(ok, use_reference_policy=False, use_critic=False)


def test_actor_validation_install_is_idempotent():
    from verl.workers.config import ActorConfig

    before = ActorConfig.__dict__["validate"]
    gv._install_actor_validation()
    assert ActorConfig.__dict__["validate"] is before is gv._actor_validate
    assert gv._actor_validate.verl.__qualname__ == "ActorConfig.validate"  # verl's own, not a wrapper of it


@pytest.mark.parametrize("G", [4, 8])
def test_documented_per_c_key_count_is_what_a_loss_call_logs(G):
    """docs/scale-out.md states the number of per-``c`` keys a step logs; a real loss call logs that many."""
    from test_verl import actor, call, group_batch

    text = DOCS.read_text()
    n_doc = int(re.search(r"key count at\s+`(\d+) · \(G − 1\)`", text).group(1))
    old, logp, adv, mask, _ = group_batch(3, G=G)
    _, _, m = call("gapo", old, logp, adv, mask, actor(G=G, policy_loss=GAPOPolicyLossConfig(eps_high_max=0.28)))
    by_c = sorted(k for k in m if re.fullmatch(r"actor/gapo_\w+_by_c/\d+", k))
    assert len(by_c) == n_doc * (G - 1), by_c
    assert {int(k.rsplit("/", 1)[1]) for k in by_c} == set(range(1, G))
