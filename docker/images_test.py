"""Static checks of rlk's image recipes (fast, no build, no daemon; runs in CI).

    .venv/bin/python -m pytest docker/images_test.py -q

Checks: every FROM base is pinned by digest or built locally by ci/build_images.sh; every pip
install uses a hash-locked file (--require-hashes) or exact pins; every apt-get install pins
versions; the three recipes install the same shared lock (third_party/requirements.lock); the
engine lock is fully hashed; rlk-cpu and rlk-h200 pin a C/C++ compiler and their Python's
headers (torch inductor, Triton's run-time C launcher build); rlk-h200 pins the stack measured on
the H200 machine (docker/rlk-h200/h200_stack.txt: its Ubuntu packages, Python 3.12, torch, triton,
numpy) and vLLM 0.26.0's bundle (third_party/vllm_h200/wheels.lock: same versions, same sha256);
.venv-vllm's lock leaves out what setup_vllm.sh must not install; docker/images.lock.json and
docs/results/images.json are well formed. The checkers are also run on bad recipes and mutated
pins, so each check can fail.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
IMAGES = ("rlk-cpu", "rlk-h200", "rlk-mi300x")
PROFILES = {"rlk-cpu": "cpu", "rlk-h200": "h200", "rlk-mi300x": "mi300x-8"}
SHA = re.compile(r"^sha256:[0-9a-f]{64}$")
PLACEHOLDER = "sha256:" + "0" * 64
SHARED_LOCK = os.path.join(ROOT, "third_party", "requirements.lock")
H200_LOCK = os.path.join(HERE, "rlk-h200", "requirements.lock")
H200_STACK = os.path.join(HERE, "rlk-h200", "h200_stack.txt")
H200_BUNDLE = os.path.join(ROOT, "third_party", "vllm_h200", "wheels.lock")
VLLM_CPU_LOCK = os.path.join(ROOT, "third_party", "vllm_cpu", "requirements.lock")
BUILD_SCRIPT = os.path.join(ROOT, "ci", "build_images.sh")


def read(path: str) -> str:
    with open(path) as f:
        return f.read()


def instructions(text: str) -> list[tuple[str, str]]:
    """(KEYWORD, rest) of a Dockerfile, continuation lines joined, comments dropped."""
    out, buf = [], ""
    for line in text.splitlines():
        s = line.strip()
        if not buf and (not s or s.startswith("#")):
            continue
        if buf and s.startswith("#"):
            continue
        buf += " " + s[:-1] if s.endswith("\\") else " " + s
        if not s.endswith("\\"):
            kw, _, rest = buf.strip().partition(" ")
            out.append((kw.upper(), rest.strip()))
            buf = ""
    return out


def local_base_names() -> set[str]:
    """Bases ci/build_images.sh builds locally (BASE_NAME=...)."""
    return set(re.findall(r"^BASE_NAME=(\S+)", read(BUILD_SCRIPT), re.M))


def base_problems(text: str, local: set[str]) -> list[str]:
    ins = instructions(text)
    args = {}
    probs = []
    for kw, rest in ins:
        if kw == "ARG" and "=" in rest:
            k, _, v = rest.partition("=")
            args.setdefault(k, v)
        if kw == "FROM":
            ref = rest.split()[0]
            m = re.fullmatch(r"\$\{?(\w+)\}?", ref)
            if m:
                ref = args.get(m.group(1), "")
            if ref in local:
                continue
            name, _, digest = ref.partition("@")
            if not SHA.match(digest):
                probs.append(f"FROM {ref}: not pinned by digest and not built locally")
            elif digest == PLACEHOLDER and "DIGEST-UNVERIFIED:" not in text:
                probs.append(f"FROM {ref}: placeholder digest not declared DIGEST-UNVERIFIED")
    if not any(kw == "FROM" for kw, _ in ins):
        probs.append("no FROM")
    return probs


def _commands(run: str) -> list[list[str]]:
    run = re.sub(r"^(--mount=\S+\s+)+", "", run)
    out = []
    for part in re.split(r"&&|;|\|\||>", run):
        try:
            toks = shlex.split(part)
        except ValueError:
            toks = part.split()
        if toks:
            out.append(toks)
    return out


HASHED_FILES = ("/opt/rlk/requirements.lock", "/opt/rlk/engine.lock", "/tmp/rest.lock")


def pip_problems(text: str) -> list[str]:
    probs = []
    for kw, rest in instructions(text):
        if kw != "RUN":
            continue
        for toks in _commands(rest):
            if "pip" not in " ".join(toks[:3]) or "install" not in toks:
                continue
            args = toks[toks.index("install") + 1:]
            reqs = [args[i + 1] for i, a in enumerate(args) if a in ("-r", "--requirement")]
            positional, skip = [], False
            for a in args:
                if skip:
                    skip = False
                    continue
                if a in ("-r", "--requirement", "--cert", "--find-links", "-f", "--index-url", "-i",
                         "--extra-index-url", "-c", "--constraint"):
                    skip = True
                elif not a.startswith("-"):
                    positional.append(a)
            line = " ".join(toks)
            if reqs:
                if "--require-hashes" not in args:
                    probs.append(f"pip -r without --require-hashes: {line}")
                probs += [f"pip -r {r}: not a hash-locked file" for r in reqs if r not in HASHED_FILES]
            for p in positional:
                local = p.startswith("/") and "--no-index" in args and "--no-deps" in args
                if not local and not re.fullmatch(r"[A-Za-z0-9_.\-\[\]]+==[A-Za-z0-9_.+!]+", p):
                    probs.append(f"pip install {p}: not an exact pin")
            if not reqs and not positional:
                probs.append(f"pip install with nothing to install: {line}")
    return probs


def apt_problems(text: str) -> list[str]:
    probs = []
    for kw, rest in instructions(text):
        if kw != "RUN":
            continue
        for toks in _commands(rest):
            if toks[:1] in (["apt-get"], ["apt"]) and "install" in toks:
                for a in toks[toks.index("install") + 1:]:
                    if not a.startswith("-") and not re.fullmatch(r"[a-z0-9.+\-]+=[A-Za-z0-9.+~:\-]+", a):
                        probs.append(f"apt package without an exact version: {a}")
    return probs


def recipe(name: str) -> str:
    return read(os.path.join(HERE, name, "Dockerfile"))


@pytest.mark.parametrize("name", IMAGES)
def test_base_pinned(name):
    assert base_problems(recipe(name), local_base_names()) == []


@pytest.mark.parametrize("name", IMAGES)
def test_pip_hash_locked_or_pinned(name):
    text = recipe(name)
    assert pip_problems(text) == []
    assert "--require-hashes" in text


@pytest.mark.parametrize("name", IMAGES)
def test_apt_versions_pinned(name):
    assert apt_problems(recipe(name)) == []


@pytest.mark.parametrize("name", IMAGES)
def test_shared_lock_and_provenance_env(name):
    ins = instructions(recipe(name))
    copies = " ".join(rest for kw, rest in ins if kw == "COPY")
    assert "requirements.lock" in copies.split(), f"{name} does not install the shared lock"
    runs = " ".join(rest for kw, rest in ins if kw == "RUN")
    assert "-r /opt/rlk/requirements.lock" in runs or "/opt/rlk/requirements.lock --" in runs
    env = " ".join(rest for kw, rest in ins if kw == "ENV")
    assert "RLK_IMAGE_TAG=${RLK_IMAGE_TAG}" in env and "RLK_IMAGE_DIGEST=${RLK_IMAGE_DIGEST}" in env
    cmd = [rest for kw, rest in ins if kw == "CMD"]
    assert len(cmd) == 1
    argv = json.loads(cmd[0])
    assert argv[1:4] == ["-m", "rlk.gate.release_gate", "--profile"] and argv[4] == PROFILES[name]
    assert argv[5:] == ["--out", "/out"]


def test_build_script_ships_the_shared_lock():
    s = read(BUILD_SCRIPT)
    assert 'cp third_party/requirements.lock "$ctx/requirements.lock"' in s
    assert "--timestamp 0" in s and "SOURCE_DATE_EPOCH=0" in s and "aux-cache" in s
    assert "--secret" in s and "--pull=never" in s


def _lock_subtract():
    sys.path.insert(0, HERE)
    try:
        import lock_subtract
    finally:
        sys.path.remove(HERE)
    return lock_subtract


@pytest.mark.parametrize("path", [SHARED_LOCK, H200_LOCK, VLLM_CPU_LOCK])
def test_locks_fully_hashed(path):
    ents = _lock_subtract().entries(path)
    assert len(ents) > 10
    for name, lines in ents:
        assert any("--hash=sha256:" in l for l in lines), f"{path}: {name} has no hash"


def lock_pins(path: str) -> dict[str, tuple[str, list[str]]]:
    """name -> (version, sha256 hashes) of a hash-locked requirements file."""
    out = {}
    for n, ls in _lock_subtract().entries(path):
        out[n] = (ls[0].split("==")[1].split()[0], re.findall(r"--hash=sha256:([0-9a-f]{64})", "".join(ls)))
    return out


def measured_stack(path: str = H200_STACK) -> dict[str, dict[str, str]]:
    """The H200 machine's record: pip freeze, dpkg versions and the imported toolchain."""
    sec, out = None, {"freeze": {}, "dpkg": {}, "toolchain": {}}
    norm = _lock_subtract().norm
    for line in open(path):
        line = line.strip()
        if line.startswith("#") or not line:
            continue
        if line.startswith("---"):
            sec = line[3:].lower()
        elif sec == "freeze" and "==" in line:
            n, v = line.split("==")
            out["freeze"][norm(n)] = v
        elif sec == "dpkg" and "=" in line:
            n, v = line.split("=", 1)
            out["dpkg"][n] = v
        elif sec == "torch" and not out["toolchain"]:
            torch, cuda, triton, numpy, python = line.split()[:5]
            out["toolchain"] = {"torch": torch, "cuda": cuda, "triton": triton, "numpy": numpy, "python": python}
    return out


def bundle_pins(path: str = H200_BUNDLE) -> dict[str, tuple[str, str]]:
    """name -> (version, sha256) of third_party/vllm_h200/wheels.lock."""
    return {l.split()[0]: (l.split()[1], l.split()[2]) for l in open(path) if l.strip() and not l.startswith("#")}


def declared_differences(path: str = H200_LOCK) -> dict[str, str]:
    """name -> measured version, for the packages the lock's header says were resolved differently."""
    text = read(path).split("Resolved to another version", 1)
    if len(text) == 1:
        return {}
    block = text[1].split("\n# Also pinned by", 1)[0]
    return dict(re.findall(r"^#   (\S+) \S+ \(measured: (\S+)\)$", block, re.M))


def h200_pin_problems(lock: dict, stack: dict, bundle: dict, differs: dict) -> list[str]:
    probs = []
    tc = stack["toolchain"]
    want = {"torch": tc["torch"].split("+")[0], "triton": tc["triton"], "vllm": "0.26.0", "megatron-core": "0.19.2"}
    for n, v in want.items():
        if lock.get(n, ("",))[0] != v:
            probs.append(f"{n}: lock {lock.get(n, ('missing',))[0]}, measured {v}")
    for n, (v, h) in bundle.items():
        if n in differs:
            continue
        if n not in lock:
            probs.append(f"{n}: in the H200 bundle, not in the lock")
        elif lock[n][0] != v or h not in lock[n][1]:
            probs.append(f"{n}: lock {lock[n][0]} {lock[n][1]}, bundle {v} {h}")
    for n, (v, _) in lock.items():
        m = bundle[n][0] if n in bundle else stack["freeze"].get(n)
        if m is not None and m != v and differs.get(n) != m:
            probs.append(f"{n}: lock {v}, measured {m}, not declared in the lock's header")
    return probs


def test_engine_lock_pins_the_measured_h200_stack():
    lock, stack = lock_pins(H200_LOCK), measured_stack()
    assert stack["toolchain"]["torch"] == "2.11.0+cu130" and stack["toolchain"]["python"].startswith("3.12.")
    assert stack["freeze"]["torch"] == "2.11.0", "PyPI's torch 2.11.0 (reports 2.11.0+cu130), not a +cu130 index wheel"
    differs = declared_differences()
    assert not {"torch", "triton", "vllm", "megatron-core"} & set(differs)
    assert h200_pin_problems(lock, stack, bundle_pins(), differs) == []
    assert all(len(h) == 1 for _, h in lock.values()), "one wheel per package: the one pip chose"


def test_h200_pin_check_fails_on_mutated_pins():
    lock, stack, bundle = lock_pins(H200_LOCK), measured_stack(), bundle_pins()
    differs = declared_differences()
    for mutate in (
        lambda l: l.update(triton=("3.8.0", l["triton"][1])),
        lambda l: l.update(torch=("2.14.0", l["torch"][1])),
        lambda l: l.update(vllm=("0.26.0", ["0" * 64])),
        lambda l: l.update(pydantic=("2.14.5", l["pydantic"][1])),
        lambda l: l.pop("openai-harmony"),
    ):
        bad = dict(lock)
        mutate(bad)
        assert h200_pin_problems(bad, stack, bundle, differs), "a mutated pin must be reported"


def test_h200_apt_pins_are_the_h200_machines():
    pins, dpkg = apt_pins(recipe("rlk-h200")), measured_stack()["dpkg"]
    assert pins and {p: dpkg.get(p) for p in pins} == pins
    assert pins["python3.12"].startswith("3.12.3-"), "the H200 machine's Python: 3.12.3"
    bad = recipe("rlk-h200").replace("binutils=2.42-4ubuntu2.5", "binutils=2.42-4ubuntu2.6")
    assert {p: dpkg.get(p) for p in apt_pins(bad)} != apt_pins(bad)


def test_lock_subtract_keeps_the_rest_hashed(tmp_path):
    out = subprocess.run(
        [sys.executable, os.path.join(HERE, "lock_subtract.py"), SHARED_LOCK, "--engine", H200_LOCK],
        capture_output=True, text=True, check=True).stdout
    p = tmp_path / "rest.lock"
    p.write_text(out)
    kept = dict(_lock_subtract().entries(str(p)))
    assert "torch" not in kept and "triton" not in kept and "numpy" not in kept
    assert "absl-py" in kept and "pytest" in kept
    assert all(any("--hash=" in l for l in ls) for ls in kept.values())


def test_images_lock_well_formed():
    lock = json.loads(read(os.path.join(HERE, "images.lock.json")))
    assert lock["schema"] == "rlk.images.lock.v1"
    assert SHA.match(lock["base"]["digest"]) and lock["base"]["name"] in local_base_names()
    assert "rlk-cpu" in lock["images"]
    assert "rlk-mi300x" not in lock["images"], "rlk-mi300x cannot be built here"
    for name, e in lock["images"].items():
        assert name in IMAGES
        assert SHA.match(e["digest"]) and SHA.match(e["inputs_sha256"]) and SHA.match(e["base_digest"])
        assert e["tag"].startswith(f"localhost/{name}:") and e["tag"].endswith(e["inputs_sha256"][7:19])
        assert e["size_mb"] > 0


def test_results_images_json():
    res = json.loads(read(os.path.join(ROOT, "docs", "results", "images.json")))
    lock = json.loads(read(os.path.join(HERE, "images.lock.json")))
    rows = {r["image"]: r for r in res["images"]}
    assert set(rows) == set(IMAGES)
    for name, r in rows.items():
        for k in ("tag", "digest", "size_mb", "built", "why", "smoke_passed", "rebuild_digest_equal"):
            assert k in r, f"{name}: {k} missing"
        assert isinstance(r["built"], bool) and r["why"]
        if r["built"]:
            assert r["digest"] == lock["images"][name]["digest"] and r["tag"] == lock["images"][name]["tag"]
        else:
            assert r["smoke_passed"] is False and r["rebuild_digest_equal"] is None


# --- the checkers catch bad recipes ------------------------------------------------------------
BAD = """ARG BASE=debian:bookworm-slim
FROM ${BASE}
RUN apt-get update && apt-get install -y python3 curl=7.88.1-10
RUN pip install numpy && pip install torch==2.13.0
RUN pip install -r requirements.txt
"""


def test_checkers_flag_bad_recipe():
    assert base_problems(BAD, {"localhost/x:y"}) == [
        "FROM debian:bookworm-slim: not pinned by digest and not built locally"]
    assert apt_problems(BAD) == ["apt package without an exact version: python3"]
    probs = pip_problems(BAD)
    assert "pip install numpy: not an exact pin" in probs
    assert not any("torch" in p for p in probs)
    assert any("without --require-hashes" in p for p in probs)
    assert any("requirements.txt: not a hash-locked file" in p for p in probs)
    zero = "FROM rocm/pytorch@" + PLACEHOLDER + "\n"
    assert base_problems(zero, set()) and not base_problems("# DIGEST-UNVERIFIED: x\n" + zero, set())


# --- rlk-cpu is the embedded reference stack (issue #13): + megatron-core, + vllm-cpu -----------
def _script_pins(path: str) -> dict[str, str]:
    return dict(re.findall(r"^([A-Z0-9_]+)=([^\s$]+)$", read(os.path.join(ROOT, path)), re.M))


def _run_with(text: str, script: str) -> str:
    runs = [rest for kw, rest in instructions(text) if kw == "RUN" and script in rest]
    assert len(runs) == 1, f"rlk-cpu: {script} must run exactly once, got {len(runs)}"
    return runs[0]


def test_cpu_installs_megatron_core_pinned_as_ci_does():
    run = _run_with(recipe("rlk-cpu"), "ci/setup_megatron.sh")
    assert "bash /opt/rlk/src/ci/setup_megatron.sh" in run, "the shipped checkout's script"
    assert "RLK_VENV_PYTHON=/opt/venv/bin/python" in run, "megatron-core goes into the main venv"
    assert "RLK_MEGATRON_WHEEL" not in run, "the hash-pinned PyPI cp311 wheel, not a carried one"
    s = read(os.path.join(ROOT, "ci", "setup_megatron.sh"))
    pins = _script_pins("ci/setup_megatron.sh")
    assert pins["VERSION"] == "0.19.2"
    assert re.fullmatch(r"[0-9a-f]{64}", pins["CP311_SHA256"])
    assert "--require-hashes" in s and "--no-deps" in s and "--ignore-requires-python" in s
    assert "megatron-core==%s --hash=sha256:%s" in s


def test_cpu_installs_vllm_cpu_pinned_in_a_separate_venv_as_ci_does():
    text = recipe("rlk-cpu")
    run = _run_with(text, "ci/setup_vllm.sh")
    assert "bash /opt/rlk/src/ci/setup_vllm.sh" in run
    venv = re.search(r"RLK_VLLM_VENV=(\S+)", run).group(1)
    assert venv == "/opt/venv-vllm" and venv != "/opt/venv", "vllm-cpu needs its own venv"
    assert "RLK_TORCH_FIND_LINKS=/wheels" in run and "source=wheels,target=/wheels" in run, \
        "torch 2.13.0+cpu from the build context's wheel (checked against the lock's hash)"
    s = read(os.path.join(ROOT, "ci", "setup_vllm.sh"))
    assert _script_pins("ci/setup_vllm.sh")["LOCK"] == "third_party/vllm_cpu/requirements.lock"
    assert '--no-deps --require-hashes "${src[@]}" -r "$LOCK"' in s
    pins = {n: v for n, (v, _) in lock_pins(VLLM_CPU_LOCK).items()}
    assert (pins["torch"], pins["vllm-cpu"], pins["triton"]) == ("2.13.0+cpu", "0.32.0", "3.6.0")
    # builds that do not match torch 2.13.0+cpu (they break `import vllm`) are never installed
    left_out = re.search(r'^LEFT_OUT="([^"]*)"', s, re.M).group(1).split()
    assert sorted(left_out) == ["torchaudio", "torchcodec", "torchvision"]
    assert not set(left_out) & set(pins)
    assert "install -q --no-deps -e ." in s
    # the main venv stays the shared lock's: vllm-cpu never goes into /opt/venv
    assert "vllm" not in " ".join(r for kw, r in instructions(text) if kw == "RUN" and "setup_vllm" not in r)
    # vllm-cpu's vllm._C links libnuma.so.1 (without it vLLM's CPU engine cannot start)
    assert re.search(r"\blibnuma1=\S+", text), "rlk-cpu: libnuma1 (pinned) for vllm._C"
    # vLLM's CPU engine runs torch.compile: inductor builds C++ kernels with g++ against <Python.h>
    for pkg in ("g++", "g++-12", "libstdc++-12-dev", "libc6-dev", "python3.11-dev", "libpython3.11-dev"):
        assert re.search(r"(?<![\w.+-])%s=\S+" % re.escape(pkg), text), f"rlk-cpu: {pkg} (pinned) for torch inductor"
    # and the default command stays the cpu gate under the main venv
    env = " ".join(r for kw, r in instructions(text) if kw == "ENV")
    assert "PATH=/opt/venv/bin:" in env


# --- run-time C/C++ compiler + Python headers (torch inductor; Triton's C launcher) -------------
# gcc N: 12 in Debian bookworm (rlk-cpu), 13 in Ubuntu 24.04 (rlk-h200, the H200 machine's).
GCC = {"rlk-cpu": "12", "rlk-h200": "13"}


def compiler_pkgs(n: str) -> tuple[str, ...]:
    return ("gcc", f"gcc-{n}", "g++", f"g++-{n}", f"cpp-{n}", f"libstdc++-{n}-dev", f"libgcc-{n}-dev",
            "binutils", "libc6-dev")


def apt_pins(text: str) -> dict[str, str]:
    """package -> exact version of every `apt-get install` in the recipe's RUN steps."""
    pins = {}
    for kw, rest in instructions(text):
        if kw != "RUN":
            continue
        for toks in _commands(rest):
            if toks[:1] in (["apt-get"], ["apt"]) and "install" in toks:
                pins.update(a.split("=", 1) for a in toks[toks.index("install") + 1:]
                            if not a.startswith("-") and "=" in a)
    return pins


@pytest.mark.parametrize("name", ("rlk-cpu", "rlk-h200"))
def test_runtime_compiler_and_python_headers_pinned(name):
    # rlk-cpu: vLLM's CPU engine runs torch.compile (inductor builds C++ with g++ against
    # <Python.h>). rlk-h200: Triton's NVIDIA driver compiles its C launcher (cuda_utils) with the
    # system C compiler against <Python.h> at run time ("Failed to find C compiler" without it),
    # and inductor builds C++ there too.
    pins = apt_pins(recipe(name))
    for pkg in compiler_pkgs(GCC[name]):
        assert pkg in pins, f"{name}: {pkg} (pinned) for the run-time compiler"
    # the headers are those of the image's Python: the python3.X the venv is made from
    pys = {p for p in pins if re.fullmatch(r"python3\.\d+", p)}
    assert len(pys) == 1, f"{name}: exactly one python3.X in the apt line, got {sorted(pys)}"
    py = pys.pop()
    assert re.search(r"python3(\.\d+)? -m venv /opt/venv", recipe(name))
    for pkg in (f"{py}-dev", f"lib{py}-dev"):
        assert pins.get(pkg) == pins[py], f"{name}: {pkg} pinned to {py}'s version {pins[py]}"
    # Ubuntu 24.04 names the shared library package lib{py}t64 (64-bit time_t)
    lib = pins.get(f"lib{py}", pins.get(f"lib{py}t64"))
    assert lib == pins[py], f"{name}: lib{py} pinned to {py}'s version {pins[py]}"


def test_build_context_ships_the_setup_scripts():
    s = read(BUILD_SCRIPT)
    # rlk's checkout (with ci/) is the context's src/; only docs, the images lock and out/ are left out
    assert "local excl=(':!docs' ':!docker/images.lock.json' ':!out')" in s
    for f in ("ci/setup_megatron.sh", "ci/setup_vllm.sh"):
        assert os.path.isfile(os.path.join(ROOT, f))
