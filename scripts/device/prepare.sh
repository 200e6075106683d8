#!/usr/bin/env bash
# Run HERE before a device call: downloads the Debian packages the build needs and extracts them
# into .debs/root (ignored by git), and the pure-Python wheels scripts/device/python.sh installs
# the package with (scikit-build-core, pybind11, pytest and their dependencies) into .debs/wheels,
# all to be named in the device tool's `carry`. The GPU machine's image has LibTorch
# (/opt/torch/.venv), nvcc, cmake and ninja, but no internet.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=scripts/env.sh
. "$here/../env.sh"
dest="$AUTOBATCH_ROOT/.debs"
pkgs=(libspdlog-dev libspdlog1.10 libfmt-dev libfmt9 libcxxopts-dev nlohmann-json3-dev
      libgtest-dev libgmock-dev googletest zlib1g-dev zlib1g)
rm -rf "$dest" && mkdir -p "$dest/pkgs" "$dest/root"
(cd "$dest/pkgs" && apt-get download "${pkgs[@]}" >/dev/null)
for deb in "$dest"/pkgs/*.deb; do dpkg -x "$deb" "$dest/root"; done
rm -rf "$dest/pkgs" "$dest/root/usr/src" "$dest/root/usr/share/doc"
py="$AUTOBATCH_PYTHON"
[ -x "$py" ] || py=python3
"$py" -m pip download --quiet --no-deps --only-binary=:all: --dest "$dest/wheels" \
  scikit-build-core pybind11 pytest pluggy iniconfig packaging pathspec exceptiongroup tomli \
  typing_extensions pygments
du -sh "$dest"
