"""The RL loop with vLLM + rlk's strict plugin as the rollout engine (CPU, Triton interpreter).

Reuses the session engine (conftest.py: trained ``tiny-hd64``; ``strict_engine_kwargs`` installs
the worker extension). The weight sync goes through ``collective_rpc`` by method name with a
path and a generation (no pickled tensors or functions); the loop's strict promise (every ratio
exactly 1.0) must hold with vLLM's reported logp as the old logp.
"""

import pytest

LC = dict(model="tiny-hd64", route="strict", prompts_per_step=1, group_size=4, response_len=3, device="cpu")


def _setup():
    from rlk.models.qwen3.layouts import hf_to_fused
    from rlk.rl.loop import LoopConfig

    lc = LoopConfig(steps=2, **LC)
    cfg, hf = lc.weights()
    return lc, cfg, hf_to_fused(cfg, hf)


def test_sync_through_worker_returns_trainer_fingerprint_then_generates(engine):
    from rlk.integrations.vllm.rl_engine import VllmRolloutEngine
    from rlk.rl import sync

    llm, _ = engine
    lc, cfg, fused = _setup()
    eng = VllmRolloutEngine(cfg, fused, "strict", lc, llm=llm)
    rec = sync.sync_remote(fused, eng, 0, kind="sha256")
    assert rec["match"] and rec["sha256_trainer"] == rec["sha256_rollout"] == sync.fingerprint(fused), rec
    assert eng.weight_generation == 0 and llm.collective_rpc("rlk_generation") == [eng.base + 1]
    assert eng.fingerprint("device") == sync.fingerprint(fused, "device")
    res = eng.generate([[100, 101, 102], [100, 101, 102]], step=0)
    assert [len(r) for r in res.responses] == [3, 3] and all(lp.shape == (3,) for lp in res.logp)
    # A stale generation is refused by the model (nothing loaded); the held weights stay verified.
    with pytest.raises(Exception, match="stale"):
        eng.receive(fused, -1)
    assert eng.fingerprint() == rec["sha256_trainer"]


def test_two_strict_rl_steps_with_vllm_engine_ratio_exactly_one(engine):
    from rlk.integrations.vllm.rl_engine import make_engine
    from rlk.rl.loop import LoopConfig, run_arm, strict_failures

    llm, _ = engine
    arm = run_arm(LoopConfig(steps=2, **LC), make_engine=make_engine(llm=llm))
    s = arm["summary"]
    assert strict_failures(arm) == [], (strict_failures(arm), s)
    assert s["ratio_not_one"] == 0 and s["logp_mismatch"] == 0 and s["tokens"] == 2 * 4 * 3, s
    assert s["syncs_verified"] == 3 and arm["initial_sync"]["match"], s
    gens = [r["sync"]["generation"] for r in arm["steps"]]
    assert gens == [1, 2]
    # Seeded: step 1's group has different rewards, so its update moves the weights and the last
    # sync carries new weights, which the workers hold.
    last, prev = (r["sync"]["sha256_trainer"] for r in arm["steps"][::-1])
    assert arm["steps"][1]["reward_std"] > 0 and last != prev, [r["reward_std"] for r in arm["steps"]]
    assert llm.collective_rpc("rlk_fingerprint", args=("sha256",)) == [last]


def test_corrupted_transport_raises_weight_sync_error(engine):
    from safetensors.torch import load_file, save_file

    from rlk.integrations.vllm.rl_engine import VllmRolloutEngine
    from rlk.rl import sync

    def flip_one(path):
        w = load_file(path)
        k = sorted(w)[0]
        t = w[k].clone()
        t.view(-1)[7] = -t.view(-1)[7] if float(t.view(-1)[7]) != 0 else 1.0
        w[k] = t
        save_file(w, path)

    llm, _ = engine
    lc, cfg, fused = _setup()
    eng = VllmRolloutEngine(cfg, fused, "strict", lc, llm=llm, before_rpc=flip_one)
    with pytest.raises(sync.WeightSyncError, match="fingerprint mismatch"):
        sync.sync_remote(fused, eng, 0)
    assert eng.weight_generation is None
    with pytest.raises(Exception, match="no verified weight sync"):
        eng.generate([[1, 2]], 0)


def test_unknown_route_refused():
    from rlk.errors import UnsupportedConfigError
    from rlk.integrations.vllm.rl_engine import VllmRolloutEngine

    with pytest.raises(UnsupportedConfigError, match="one of"):
        VllmRolloutEngine(None, {}, "fast", None, llm=object())


def test_engine_built_here_starts_with_the_strict_arm_environment(tmp_path, monkeypatch):
    """An engine the loop builds itself (``python -m rlk.rl --engine vllm``) is created after the
    trainer has initialized the device: vLLM must see rlk's plugin, the strict variables, the
    platform's runner (V1 on the CPU build) and spawned engine processes before it starts (a forked engine process cannot use
    CUDA). A stand-in ``vllm.LLM`` records the environment it is created under."""
    import os
    import sys
    import types

    from rlk.integrations.vllm import plugin, rl_engine
    from rlk.rl.loop import LoopConfig

    seen = {}

    class FakeLLM:
        def __init__(self, **kw):
            seen.update(env=dict(os.environ), kw=kw)

        def collective_rpc(self, method, args=()):
            return [1]

    from rlk import determinism

    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(LLM=FakeLLM, __version__="0.0-stand-in"))
    monkeypatch.setattr(plugin, "strict_engine_kwargs", lambda **kw: kw)
    monkeypatch.setattr(rl_engine, "write_model_dir", lambda path, cfg, fused: path)
    lc = LoopConfig(steps=1, **LC)
    cfg, _ = lc.weights()
    # Every variable the engine may set starts unset and has its prior value back after the block.
    engine_vars = {*plugin.strict_process_env(str(tmp_path)), *determinism.STRICT_ENV, "TRITON_INTERPRET",
                   "VLLM_TARGET_DEVICE", "VLLM_USE_V2_MODEL_RUNNER"}
    with determinism.scoped({}, drop=engine_vars):
        eng = rl_engine.VllmRolloutEngine(cfg, {}, "strict", lc, workdir=str(tmp_path))
    env = seen["env"]
    assert env["VLLM_PLUGINS"] == "rlk" and env["VLLM_WORKER_MULTIPROC_METHOD"] == "spawn", env
    assert env["VLLM_USE_V2_MODEL_RUNNER"] == "0" and env["VLLM_NO_USAGE_STATS"] == "1"
    assert env["RLK_VLLM_COUNTERS_DIR"].startswith(str(tmp_path))
    assert eng.base == 1 and seen["kw"]["max_num_seqs"] == lc.prompts_per_step * lc.group_size
    d = eng.describe()
    assert d["name"] == "vLLM + rlk strict plugin" and d["engine_kwargs"]["max_num_seqs"] == seen["kw"]["max_num_seqs"]
    assert d["use_v2_model_runner"] is None  # the stand-in has no engine config
    eng.llm.llm_engine = types.SimpleNamespace(vllm_config=types.SimpleNamespace(use_v2_model_runner=True))
    assert eng.describe()["use_v2_model_runner"] is True  # the report names the runner that served


def test_native_route_on_stock_vllm_syncs_and_reports_the_ratio(vllm_workdir, tmp_path):
    """The native route's rollout engine is stock vLLM (its own Qwen3, no rlk code in its
    processes): every sync loads through vLLM's in-place reload and the stock worker's
    fingerprint over the trainer's names equals the trainer's, a stale generation is refused, each
    step reports the ratio's distribution against rlk's native trainer, and the engine is shut
    down when the arm ends."""
    from rlk.integrations.vllm.rl_engine import VllmRolloutEngine, make_engine
    from rlk.rl.loop import Hooks, LoopConfig, run_arm

    lc = LoopConfig(steps=2, **dict(LC, route="native"))
    # fp32: the CPU build's bf16 kernels end the worker process on the CI machines (the engine
    # dies at its first step, with or without rlk); the GPU runs stock vLLM in bf16.
    kw = dict(workdir=str(tmp_path), enforce_eager=True, max_model_len=256, max_num_batched_tokens=256,
              dtype="float32")
    engines = []

    def build(cfg, fused, route, lc_):
        engines.append(VllmRolloutEngine(cfg, fused, route, lc_, **kw))
        return engines[-1]

    seen = {}

    def after_sync(generation, engine):
        # While the engine is up: the held-bytes fingerprint is refused on the CPU build (it
        # repacks its linear weights), and a generation not newer than the held one is refused
        # before any file is read.
        if generation == 1:
            with pytest.raises(Exception, match="repacked"):
                engine.fingerprint()
            held_gen = engine._one("rlk_generation")
            with pytest.raises(Exception, match="stale"):
                engine._one("rlk_load_weights", "not-read", held_gen, "sha256", [])
            seen["checked"] = held_gen

    arm = run_arm(lc, hooks=Hooks(after_sync=after_sync), make_engine=build)
    eng = engines[0]
    assert seen["checked"] == eng.base + 2 and eng.llm is None  # checked mid-run; closed after the arm
    assert arm["engine"]["name"] == "stock vLLM" and arm["engine"]["architecture"] == "Qwen3ForCausalLM"
    # vLLM's CPU build keeps no checkpoint-layout copy: the workers fingerprint what they loaded, and say so.
    import re

    basis = re.fullmatch(r"loaded; (\d+) of (\d+) tensors compared equal to the held parameters \(via (\w+)\)",
                         arm["engine"]["fingerprint_basis"])
    # The embedding and norms keep their layout on the CPU build: those held bytes were compared.
    assert basis and int(basis.group(1)) > 0 and basis.group(3) == "reload_weights", arm["engine"]
    s = arm["summary"]
    assert s["syncs_verified"] == 3 and arm["initial_sync"]["match"] and s["tokens"] == 2 * 4 * 3, s
    for r in arm["steps"]:
        assert r["sync"]["match"] and {"max", "p50", "p99"} <= set(r["abs_dev"]), r
    assert callable(make_engine())


def test_stock_engine_built_here_starts_without_rlk_and_strict_variables(tmp_path, monkeypatch):
    """The native route's stock engine starts with no plugin (``VLLM_PLUGINS`` empty), spawned
    processes, and none of the strict arm's variables, even after a strict arm of the same process
    exported them; they are back once it has started. ``close`` shuts it down and removes the
    temporary folder it made. A stand-in ``vllm.LLM`` records the environment it is created under."""
    import os
    import sys
    import types

    from rlk import determinism
    from rlk.integrations.vllm import rl_engine
    from rlk.rl.loop import LoopConfig

    seen, shut = {}, []

    class FakeLLM:
        def __init__(self, **kw):
            seen.update(env=dict(os.environ), kw=kw)
            self.llm_engine = types.SimpleNamespace(engine_core=types.SimpleNamespace(shutdown=lambda: shut.append(1)))

        def collective_rpc(self, method, args=()):
            return [1]

    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(LLM=FakeLLM, __version__="0.0-stand-in"))
    monkeypatch.setattr(rl_engine, "write_model_dir", lambda path, cfg, fused: path)
    lc = LoopConfig(steps=1, **dict(LC, route="native"))
    cfg, _ = lc.weights()
    # As after a strict arm of the same process (restored when the block ends).
    with determinism.scoped({"VLLM_PLUGINS": "rlk", "VLLM_USE_V2_MODEL_RUNNER": "0", **determinism.STRICT_ENV}):
        eng = rl_engine.VllmRolloutEngine(cfg, {}, "native", lc)
        env = seen["env"]
        assert env["VLLM_PLUGINS"] == "" and env["VLLM_WORKER_MULTIPROC_METHOD"] == "spawn", env
        assert not set(determinism.STRICT_ENV) & set(env) and "VLLM_USE_V2_MODEL_RUNNER" not in env
        assert seen["kw"]["worker_extension_cls"].endswith("StockWorkerExtension") and seen["kw"]["dtype"] == "bfloat16"
        assert os.environ.get("VLLM_PLUGINS") == "rlk" and os.environ.get("VLLM_USE_V2_MODEL_RUNNER") == "0"
    assert eng.describe()["name"] == "stock vLLM" and os.path.isdir(eng.workdir)
    eng.close()
    assert shut == [1] and eng.llm is None and not os.path.exists(eng.workdir)


def _inproc_probe(route: str) -> dict:
    """Run in a fresh process by :func:`test_inproc_transport_hands_tensors_to_an_engine_in_this_process`
    (an in-process engine caches vLLM's environment for its process): the ``inproc`` transport on
    ``route``. A corrupted hand-over must raise; then two loop steps on the same engine."""
    import os

    from rlk.integrations.vllm.rl_engine import VllmRolloutEngine, make_engine
    from rlk.models.qwen3.layouts import hf_to_fused
    from rlk.rl import sync
    from rlk.rl.loop import LoopConfig, run_arm, strict_failures

    lc = LoopConfig(steps=2, **dict(LC, route=route))
    cfg, hf = lc.weights()
    fused = hf_to_fused(cfg, hf)
    # The native route runs vLLM's CPU build in fp32 (its bf16 kernels end the worker on CI machines).
    kw = dict(enforce_eager=True, max_model_len=256, max_num_batched_tokens=256, transport="inproc")
    if route == "native":
        kw["dtype"] = "float32"

    def flip_one(tensors):  # the hand-over, after the sender's fingerprint
        t = tensors[sorted(tensors)[0]].view(-1)
        t[7] = -t[7] if float(t[7]) != 0 else 1.0

    out = {"loop_pid": os.getpid()}
    bad = VllmRolloutEngine(cfg, fused, route, lc, before_rpc=flip_one, **kw)
    out["built"] = bad.describe()
    if route == "strict":  # in this process: the served model itself (on a GPU its first plan is made before capture)
        model = bad.llm.collective_rpc("get_model")[0]
        rope0 = [t.data_ptr() for t in model._get_plan().rope]
    out["model_files"] = sorted(os.listdir(os.path.join(bad.workdir, "model")))
    try:
        sync.sync_remote({k: v.clone() for k, v in fused.items()}, bad, 0)
        out["corrupted"] = "accepted"
    except sync.WeightSyncError as e:
        out["corrupted"] = f"refused: {e}"[:200]
    # A process other than the worker's is refused before anything is loaded.
    try:
        bad._one("rlk_load_tensors", {}, 10 ** 6, "sha256", os.getpid() + 1)
        out["other_pid"] = "accepted"
    except Exception as e:  # noqa: BLE001 (vLLM re-raises the worker's error)
        out["other_pid"] = f"refused: {e}"[:300]
    arm = run_arm(lc, make_engine=make_engine(llm=bad.llm, transport="inproc"))
    if route == "strict":
        plan = model._get_plan()
        out["rope"] = {"same_object": plan.rope is model._rope, "kept": [t.data_ptr() for t in plan.rope] == rope0,
                       "generation": model.rlk_weight_generation}
    out.update(summary=arm["summary"], engine=arm["engine"], failures=strict_failures(arm) if route == "strict" else None,
               initial=arm["initial_sync"]["match"])
    return out


@pytest.mark.parametrize("route", ["strict", "native"])
def test_inproc_transport_hands_tensors_to_an_engine_in_this_process(vllm_workdir, route, tmp_path):
    """``transport="inproc"``: vLLM's engine core and worker run in the loop's process (started on
    dummy weights: no checkpoint is written), the sync hands them the trainer's tensors, and the
    workers' fingerprint is checked as for the file transport: a corrupted hand-over raises
    WeightSyncError, tensors from another process are refused, and the loop runs with every sync
    verified (strict: every ratio exactly 1.0). One fresh process per route."""
    import json
    import subprocess
    import sys

    code = ("import json, sys; from rlk.integrations.vllm.rl_engine_test import _inproc_probe; "
            f"print('PROBE ' + json.dumps(_inproc_probe({route!r})))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=900, cwd=str(tmp_path))
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("PROBE ")]
    assert p.returncode == 0 and lines, (p.returncode, p.stdout[-3000:], p.stderr[-6000:])
    out = json.loads(lines[-1][len("PROBE "):])
    assert out["model_files"] and not any(f.endswith(".safetensors") for f in out["model_files"]), out
    assert out["corrupted"].startswith("refused: ") and "fingerprint mismatch" in out["corrupted"], out
    assert out["other_pid"].startswith("refused: ") and "in-process transport" in out["other_pid"], out
    e, s = out["engine"], out["summary"]
    assert e["transport"] == "inproc" and out["built"]["engine_kwargs"]["load_format"] == "dummy", out["built"]
    assert out["initial"] and s["syncs_verified"] == 3 and s["tokens"] == 2 * 4 * 3, s
    if route == "strict":
        assert out["failures"] == [] and s["ratio_not_one"] == 0 and s["logp_mismatch"] == 0, out
        # Every plan reads the RoPE table of the engine's first plan (CUDA graphs captured with it
        # read it by address): after four weight generations it is still the same tensors.
        assert out["rope"]["same_object"] and out["rope"]["kept"] and out["rope"]["generation"] >= 4, out["rope"]
    else:
        assert e["name"] == "stock vLLM" and "reload_weights" in e["fingerprint_basis"], e


def test_load_tensors_refuses_an_engine_in_another_process(engine):
    """The session engine runs its worker in another process (vLLM's default): handing it tensors
    is refused by the worker before anything is loaded, and the held generation stays."""
    import os

    llm, _ = engine
    before = llm.collective_rpc("rlk_generation")
    with pytest.raises(Exception, match="in-process transport"):
        llm.collective_rpc("rlk_load_tensors", args=({}, before[0] + 1, "sha256", os.getpid()))
    assert llm.collective_rpc("rlk_generation") == before


def test_unknown_transport_and_inproc_with_several_workers_refused():
    from rlk.errors import UnsupportedConfigError
    from rlk.integrations.vllm.rl_engine import VllmRolloutEngine

    with pytest.raises(UnsupportedConfigError, match="transport 'ipc'"):
        VllmRolloutEngine(None, {}, "strict", None, llm=object(), transport="ipc")
    with pytest.raises(UnsupportedConfigError, match="tensor_parallel_size 1"):
        VllmRolloutEngine(None, {}, "strict", None, llm=object(), transport="inproc", tensor_parallel_size=2)
