#!/usr/bin/env bash
# Daemonless, reproducible builds of rlk's images (buildah/podman, no Docker daemon, no registry).
#
#   sudo bash ci/build_images.sh                  # base + rlk-cpu, writes docker/images.lock.json
#   sudo bash ci/build_images.sh cpu h200         # also the CUDA image (~10 GB, PyPI downloads;
#                                                 # its ubuntu:24.04 base is pulled by digest)
#   sudo bash ci/build_images.sh --clean cpu      # wipe the build folder first (rebuild from scratch)
#   sudo bash ci/build_images.sh --smoke cpu      # then: imports smoke + paired-arm provenance
#   RLK_SRC_REV=worktree bash ci/build_images.sh  # rlk's sources from the working tree, not HEAD
#   bash ci/build_images.sh --env                 # print the exports to use podman on that storage
#
# Steps (docker/README.md has the table):
#   1. apt-get install debootstrap buildah podman umoci skopeo runc (if missing).
#   2. Storage and sandbox settings: docker/{containers,storage,registries}.conf rendered into
#      $RLK_IMAGE_BUILD_DIR (default build/images, ignored by git and Bazel).
#   3. Base: `debootstrap --variant=minbase bookworm` (SOURCE_DATE_EPOCH=0, logs/caches removed),
#      committed with `buildah commit --timestamp 0` as localhost/rlk-base:bookworm-minbase; the
#      recipes get it by digest (BASE=localhost/rlk-base@sha256:...).
#   4. Per image: a build context of exactly the inputs (the recipe, third_party/requirements.lock,
#      rlk's checkout at one commit (git archive HEAD, minus docs/), the lock's torch CPU wheel
#      for rlk-cpu), an
#      inputs hash over all of it + base digest, then `buildah bud --timestamp 0 --pull=never`
#      with the host CA as a build *secret* only (never in a layer). The inputs hash goes into
#      the image as RLK_IMAGE_DIGEST (an image cannot know its own digest), the tag as
#      RLK_IMAGE_TAG: rlk.provenance records both.
#   5. docker/images.lock.json: tag -> manifest digest, base digest, inputs hash, size.
# rlk-h200's base is the H200 machine's OS, ubuntu:24.04 by digest (Python 3.12, which no Debian
# release serves): it is pulled from a registry, so it cannot be built where none is reachable.
# rlk-mi300x is never built here (its ROCm base cannot be fetched); see docker/README.md.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
BUILD_DIR=${RLK_IMAGE_BUILD_DIR:-$ROOT/build/images}
SUITE=bookworm
MIRROR=${RLK_DEBIAN_MIRROR:-http://deb.debian.org/debian}
BASE_NAME=localhost/rlk-base:bookworm-minbase
HOST_CA=${RLK_HOST_CA:-/etc/ssl/certs/ca-certificates.crt}
LOCK_OUT=${RLK_IMAGE_LOCK_OUT:-docker/images.lock.json}
# rlk's sources: a commit (default HEAD: what a clean checkout builds) or `worktree`.
SRC_REV=${RLK_SRC_REV:-HEAD}
[ "$SRC_REV" = worktree ] || SRC_REV=$(git rev-parse --verify "$SRC_REV^{commit}")
log() { echo "build_images: $*" >&2; }

CLEAN=0 SMOKE=0 ENV_ONLY=0 IMAGES=()
for a in "$@"; do
  case "$a" in
    --clean) CLEAN=1 ;; --smoke) SMOKE=1 ;; --env) ENV_ONLY=1 ;;
    cpu|h200) IMAGES+=("$a") ;;
    mi300x) log "rlk-mi300x is not buildable here (ROCm base unreachable); it is checked statically"; exit 2 ;;
    *) log "unknown argument $a"; exit 2 ;;
  esac
done
[ ${#IMAGES[@]} -gt 0 ] || IMAGES=(cpu)

export CONTAINERS_CONF=$BUILD_DIR/containers.conf
export CONTAINERS_STORAGE_CONF=$BUILD_DIR/storage.conf
export CONTAINERS_REGISTRIES_CONF=$BUILD_DIR/registries.conf
if [ "$ENV_ONLY" = 1 ]; then
  echo "export CONTAINERS_CONF=$CONTAINERS_CONF CONTAINERS_STORAGE_CONF=$CONTAINERS_STORAGE_CONF CONTAINERS_REGISTRIES_CONF=$CONTAINERS_REGISTRIES_CONF"
  exit 0
fi
[ "$(id -u)" = 0 ] || { log "run as root (buildah/podman rootful, debootstrap)"; exit 1; }
t_all=$SECONDS

# --- 1. tools ---------------------------------------------------------------------------------
if ! command -v buildah >/dev/null || ! command -v podman >/dev/null || ! command -v debootstrap >/dev/null \
   || ! command -v skopeo >/dev/null || ! command -v umoci >/dev/null || ! command -v runc >/dev/null; then
  log "apt-get install debootstrap buildah podman umoci skopeo runc"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -q debootstrap buildah podman umoci skopeo runc >/dev/null 2>&1 || {
    apt-get update -q >/dev/null; apt-get install -y -q debootstrap buildah podman umoci skopeo runc >/dev/null; }
fi

# --- 2. storage + sandbox settings --------------------------------------------------------------
if [ "$CLEAN" = 1 ] && [ -d "$BUILD_DIR" ]; then
  log "--clean: removing $BUILD_DIR"
  # Unmount anything buildah/podman left mounted under the storage before deleting it.
  if [ -f "$CONTAINERS_STORAGE_CONF" ]; then buildah rm --all >/dev/null 2>&1 || true; fi
  { grep -o " $BUILD_DIR/[^ ]*" /proc/mounts || true; } | sort -r | while read -r m; do umount -l "$m" 2>/dev/null || true; done
  rm -rf "$BUILD_DIR"
fi
mkdir -p "$BUILD_DIR"
DRIVER=${RLK_STORAGE_DRIVER:-overlay}
sed -e "s#@BUILD_DIR@#$BUILD_DIR#g" -e "s#@DRIVER@#$DRIVER#g" docker/storage.conf > "$CONTAINERS_STORAGE_CONF"
cp docker/containers.conf "$CONTAINERS_CONF"
cp docker/registries.conf "$CONTAINERS_REGISTRIES_CONF"

# --- 3. base ------------------------------------------------------------------------------------
base_digest() { skopeo inspect --format '{{.Digest}}' "containers-storage:$BASE_NAME" 2>/dev/null; }
if [ -z "$(base_digest)" ]; then
  t0=$SECONDS
  RFS=$BUILD_DIR/base-rootfs
  rm -rf "$RFS"
  log "debootstrap --variant=minbase $SUITE (SOURCE_DATE_EPOCH=0) ..."
  env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin SOURCE_DATE_EPOCH=0 LC_ALL=C \
    debootstrap --variant=minbase "$SUITE" "$RFS" "$MIRROR" > "$BUILD_DIR/debootstrap.log" 2>&1 \
    || { tail -20 "$BUILD_DIR/debootstrap.log" >&2; exit 1; }
  # Run-to-run noise out: logs, caches, apt lists, host files copied in by debootstrap.
  rm -rf "$RFS"/var/log/* "$RFS"/var/cache/apt/* "$RFS"/var/lib/apt/lists/* "$RFS"/var/cache/ldconfig/aux-cache \
         "$RFS"/var/cache/debconf/*-old "$RFS"/var/lib/dpkg/*-old "$RFS"/etc/resolv.conf "$RFS"/etc/hostname \
         "$RFS"/etc/machine-id "$RFS"/var/lib/dbus/machine-id "$RFS"/root/.bash_history "$RFS"/dev/*
  mkdir -p "$RFS/var/lib/apt/lists/partial" "$RFS/var/cache/apt/archives/partial"
  ctr=$(buildah from scratch)
  mnt=$(buildah mount "$ctr")
  tar -C "$RFS" --numeric-owner -cf - . | tar -C "$mnt" --numeric-owner -xpf -
  buildah umount "$ctr" >/dev/null
  buildah config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin --env LANG=C.UTF-8 \
    --cmd /bin/bash --label org.opencontainers.image.title="rlk base: debootstrap minbase $SUITE" "$ctr"
  buildah commit --quiet --timestamp 0 --format oci --rm "$ctr" "$BASE_NAME" >/dev/null
  rm -rf "$RFS"
  log "base $BASE_NAME $(base_digest) ($((SECONDS - t0)) s)"
fi
BASE_DIGEST=$(base_digest)
BASE_REF=${BASE_NAME%%:*}@$BASE_DIGEST

# --- 4. images ----------------------------------------------------------------------------------
# A build context holding exactly the inputs; its hash (with the base digest) is the inputs hash.
stage_context() {  # name ctxdir
  local name=$1 ctx=$2
  rm -rf "$ctx"; mkdir -p "$ctx/src" "$ctx/wheels"
  cp "docker/$name/Dockerfile" "$ctx/Dockerfile"
  cp third_party/requirements.lock "$ctx/requirements.lock"
  cp docker/smoke.py "$ctx/"
  [ "$name" = rlk-cpu ] || cp docker/lock_subtract.py "$ctx/"
  [ ! -f "docker/$name/requirements.lock" ] || cp "docker/$name/requirements.lock" "$ctx/engine.lock"
  # rlk's checkout (the gate's L0 build.consistent check reads it; rlk is installed editable from
  # it): every file git knows, minus results and this lock (outputs, not inputs).
  local excl=(':!docs' ':!docker/images.lock.json' ':!out')
  if [ "$SRC_REV" = worktree ]; then
    git ls-files -z --cached --others --exclude-standard -- . "${excl[@]}" \
      | while IFS= read -r -d '' f; do [ -f "$f" ] && printf '%s\0' "$f"; done \
      | tar --null -T - -cf - | tar -C "$ctx/src" -xf -
  else
    # A clean checkout: git archive of one commit (read-only on the repo).
    git archive --format=tar "$SRC_REV" -- . "${excl[@]}" | tar -C "$ctx/src" -xf -
  fi
  if [ "$name" = rlk-h200 ] && [ -f build/sm90/librlk_gemm_sm90.so ]; then
    # The sm_90 CUTLASS GEMM library, built beforehand by `python -m rlk.kernels.gemm.sm90 build`
    # (the image has no CUDA toolkit); without it the image's GEMMs run the Triton kernels (same bytes).
    mkdir -p "$ctx/src/build/sm90"
    cp build/sm90/librlk_gemm_sm90.so build/sm90/manifest.json "$ctx/src/build/sm90/"
  fi
  if [ "$name" = rlk-cpu ]; then
    # The lock's torch CPU wheel (only on disk here, not on PyPI); chosen by the lock's hash.
    local want whl
    want=$(awk '/^torch==/{p=1;next} p&&/--hash=sha256:/{sub(/.*sha256:/,"");sub(/[ \\].*/,"");print;exit}' third_party/requirements.lock)
    for whl in ${RLK_TORCH_FIND_LINKS:-/opt/wheels}/torch-2.13.0+cpu-*.whl; do
      [ -f "$whl" ] && [ "$(sha256sum "$whl" | cut -c1-64)" = "$want" ] && cp "$whl" "$ctx/wheels/" && break
    done
    ls "$ctx"/wheels/torch-*.whl >/dev/null 2>&1 || { log "no torch wheel with the lock's hash $want"; exit 1; }
  fi
  find "$ctx" -exec touch -h -d @0 {} +
}
inputs_hash() {  # ctxdir -> sha256 over (path, file sha256) of the context + the base digest
  (cd "$1" && find . -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum; echo "base $BASE_DIGEST") \
    | sha256sum | cut -c1-64
}
declare -A DIGEST TAGS INPUTS SIZE SECS IMG_BASE
for short in "${IMAGES[@]}"; do
  name=rlk-$short
  t0=$SECONDS
  ctx=$BUILD_DIR/ctx-$name
  stage_context "$name" "$ctx"
  ih=$(inputs_hash "$ctx")
  tag="localhost/$name:0.1.0-${ih:0:12}"
  log "$name: inputs sha256:$ih -> $tag; buildah bud ..."
  if [ "$name" = rlk-h200 ]; then
    # The recipe's own base, pinned by digest in its ARG BASE.
    IMG_BASE[$short]=$(sed -n 's/^ARG BASE=.*@\(sha256:[0-9a-f]\{64\}\)$/\1/p' "$ctx/Dockerfile")
    base_args=(--pull=missing)
  else
    IMG_BASE[$short]=$BASE_DIGEST
    base_args=(--pull=never --build-arg "BASE=$BASE_REF")
  fi
  buildah bud --quiet "${base_args[@]}" --timestamp 0 --format oci --layers=false --network host \
    --secret "id=hostca,src=$HOST_CA" \
    --build-arg "RLK_IMAGE_TAG=$tag" --build-arg "RLK_IMAGE_DIGEST=sha256:$ih" \
    -f "$ctx/Dockerfile" -t "$tag" "$ctx" > "$BUILD_DIR/bud-$name.log" 2>&1 \
    || { tail -40 "$BUILD_DIR/bud-$name.log" >&2; exit 1; }
  buildah tag "$tag" "localhost/$name:latest"
  DIGEST[$short]=$(skopeo inspect --format '{{.Digest}}' "containers-storage:$tag")
  SIZE[$short]=$(podman image inspect --format '{{.Size}}' "$tag")
  TAGS[$short]=$tag INPUTS[$short]=sha256:$ih SECS[$short]=$((SECONDS - t0))
  log "$name: ${DIGEST[$short]} $((SIZE[$short] / 1000000)) MB (${SECS[$short]} s)"
  rm -rf "$ctx"
done

# --- 5. images.lock.json (merged: images not built this run keep their entries) ----------------
args=()
for short in "${IMAGES[@]}"; do
  args+=("rlk-$short" "${TAGS[$short]}" "${DIGEST[$short]}" "${INPUTS[$short]}" "${SIZE[$short]}" "${SECS[$short]}"
         "${IMG_BASE[$short]}")
done
python3 - "$LOCK_OUT" "$BASE_NAME" "$BASE_DIGEST" "$SRC_REV" "${args[@]}" <<'EOF'
import json, os, subprocess, sys
out, base_name, base_digest, src_rev, rest = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5:]
try:
    lock = json.load(open(out))
except (OSError, ValueError):
    lock = {}
lock["schema"] = "rlk.images.lock.v1"
lock["base"] = {"name": base_name, "digest": base_digest,
                "recipe": "debootstrap --variant=minbase bookworm (ci/build_images.sh)"}
lock["tools"] = {t: subprocess.run([t, "--version"], capture_output=True, text=True).stdout.strip().splitlines()[0]
                 for t in ("buildah", "podman", "skopeo")}
imgs = lock.setdefault("images", {})
for i in range(0, len(rest), 7):
    name, tag, digest, inputs, size, secs, img_base = rest[i:i + 7]
    imgs[name] = {"tag": tag, "digest": digest, "base_digest": img_base, "inputs_sha256": inputs,
                  "size_mb": round(int(size) / 1e6, 1), "build_seconds": int(secs),
                  "sources": "working tree" if src_rev == "worktree" else f"git {src_rev}"}
with open(out, "w") as f:
    json.dump(lock, f, indent=1, sort_keys=True)
    f.write("\n")
EOF
log "wrote $LOCK_OUT ($((SECONDS - t_all)) s)"

# --- smoke (optional) ---------------------------------------------------------------------------
if [ "$SMOKE" = 1 ]; then
  for short in "${IMAGES[@]}"; do
    log "smoke rlk-$short: imports + paired-arm provenance"
    req=; [ "$short" = h200 ] && req="--require vllm,megatron.core"
    podman run --rm --network=none "${TAGS[$short]}" python /opt/rlk/smoke.py $req | tail -40
  done
fi
