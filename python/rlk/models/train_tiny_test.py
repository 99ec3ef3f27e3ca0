"""The tiny-model trainer: a short run learns, the corpus is deterministic and guarded, and the
training forward equals rlk's ``trainer_logp`` on the native route."""

import json
import math

import pytest
import torch

from rlk.models import train_tiny_tune as tt
from rlk.models.qwen3 import Qwen3, Qwen3Config, random_weights


def _synthetic_corpus():
    text = "".join(f"def f{i}(x):\n    return x * {i % 7} + {i}\n\n" for i in range(400)).encode()
    return tt.Corpus("synthetic", text, text[:4096], {"name": "synthetic"})


def test_twenty_steps_decrease_loss():
    tc = tt.TrainConfig(steps=20, batch=4, seq_len=64, lr=1e-2, warmup=2, eval_every=10, eval_windows=4,
                        threads=1)
    res = tt.train(Qwen3Config.named("tiny"), _synthetic_corpus(), tc, progress=None)
    val, trn = res["curve"]["val"], res["curve"]["train"]
    assert res["steps_run"] == 20 and len(trn) == 20
    assert val[0] > 5.0, val  # random init: near ln 256
    assert val[-1] < val[0] - 1.0, f"validation loss did not drop: {val}"
    assert sum(trn[-5:]) / 5 < sum(trn[:5]) / 5 - 1.0, f"training loss did not drop: {trn}"


def test_training_forward_equals_rlk_trainer_logp():
    cfg = Qwen3Config.named("tiny")
    model = Qwen3(cfg, random_weights(cfg, 3, dtype=torch.float32), "native")
    x = tt.windows(_synthetic_corpus().train, 32, 3)
    ours = tt.batched_logp(model, model.w, x).reshape(-1)
    cu = torch.arange(4, dtype=torch.int32) * 32
    ref = model.trainer_logp(x[:, :-1].reshape(-1), cu, x[:, 1:].reshape(-1))[0]
    torch.testing.assert_close(ours, ref, rtol=0, atol=1e-5)


def test_windows_and_schedule():
    x = tt.windows(bytes(range(200)), 16, 100)
    assert x.shape == (12, 17) and x[1, 0] == 16 and x[0, 16] == 16
    tc = tt.TrainConfig(steps=100, lr=1.0, warmup=10, min_lr_frac=0.1)
    assert tc.lr_at(0) == pytest.approx(0.1) and tc.lr_at(9) == pytest.approx(1.0)
    assert tc.lr_at(10) == pytest.approx(1.0) and tc.lr_at(100) == pytest.approx(0.1)
    assert all(tc.lr_at(s) >= tc.lr_at(s + 1) for s in range(10, 100))


def test_stdlib_corpus_is_deterministic_and_matches_the_record():
    a, b = tt.stdlib_corpus(), tt.stdlib_corpus()
    assert a.sha256 == b.sha256 and len(a.train) == tt.TRAIN_BYTES and len(a.val) == tt.VAL_BYTES
    with open(tt.RESULTS_JSON) as f:
        rec = json.load(f)["corpus"]
    if rec["python"] != a.meta["python"]:
        pytest.skip(f"corpus recorded under Python {rec['python']}, this is {a.meta['python']}")
    assert a.sha256 == rec["sha256"], "same Python version, different standard library text"


def test_check_corpus_refuses_another_hash(tmp_path, capsys):
    c = _synthetic_corpus()
    p = tmp_path / "r.json"
    p.write_text(json.dumps({"corpus": {"sha256": c.sha256, "python": "x"}}))
    tt.check_corpus(c, str(p), allow_change=False)  # same hash: passes
    p.write_text(json.dumps({"corpus": {"sha256": "0" * 64, "python": "x"}}))
    with pytest.raises(SystemExit, match="allow-corpus-change"):
        tt.check_corpus(c, str(p), allow_change=False)
    tt.check_corpus(c, str(p), allow_change=True)
    assert "warning" in capsys.readouterr().err
    tt.check_corpus(c, str(tmp_path / "absent.json"), allow_change=False)


def test_healthy_band_limits():
    ok = {"entropy_mean": 1.0, "entropy_any_nan": False,
          "sampled_logp": {"mean": -1.0, "std": 1.0, "p1": -5.0, "p50": -0.5, "p99": -0.01,
                           "frac_logp_zero": 0.0, "any_nan": False}}
    assert tt.healthy(ok) == []
    assert tt.healthy({**ok, "entropy_mean": 0.05})
    assert tt.healthy({**ok, "entropy_mean": 0.81 * math.log(256)})
    assert tt.healthy({**ok, "sampled_logp": {**ok["sampled_logp"], "frac_logp_zero": 0.02}})
    assert tt.healthy({**ok, "sampled_logp": {**ok["sampled_logp"], "p50": float("nan")}})


def test_config_option_and_output_locations():
    a = tt.parser().parse_args([])
    assert a.config == "tiny" and a.steps == tt.TrainConfig().steps and a.out is None
    assert tt.parser().parse_args(["--config", "tiny-hd64"]).config == "tiny-hd64"
    with pytest.raises(SystemExit):
        tt.parser().parse_args(["--config", "qwen3-8b"])  # no trained checkpoint for it
    # tiny keeps its checked-in locations; every config gets its own folder and record.
    ck, js, png = tt.outputs("tiny")
    assert (ck, js) == (tt.CHECKPOINT_DIR, tt.RESULTS_JSON) and ck.endswith("qwen3/tiny_trained")
    assert js.endswith("docs/results/tiny_trained.json") and png.endswith("docs/results/tiny_trained.png")
    ck2, js2, png2 = tt.outputs("tiny-hd64")
    assert ck2.endswith("qwen3/tiny_hd64_trained") and js2.endswith("docs/results/tiny_hd64_trained.json")
    assert png2.endswith("docs/results/tiny_hd64_trained.png")
