#!/bin/sh
# Installs the Debian packages Lumen builds against, if any is missing. Needs root
# (or sudo) only when something must be installed.
set -eu
PKGS="build-essential cmake pkg-config python3 python3-pip python3-venv libcjson-dev libpcre2-dev libzstd-dev libssl-dev libutf8proc-dev libmicrohttpd-dev clang libclang-rt-14-dev"
missing=""
for p in $PKGS; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
[ -z "$missing" ] && exit 0
echo "lumen: installing Debian packages:$missing" >&2
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $missing >&2
