# Sourced by the scripts here: apt_ensure PKG... installs the Debian packages that are not
# installed yet (one apt-get update first, only when something is missing); as root or
# through sudo. LOG_PREFIX names the calling script in its message.
apt_sudo() {
  if [ "$(id -u)" -ne 0 ]; then sudo "$@"; else "$@"; fi
}

apt_ensure() {
  local missing=() p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  echo "[${LOG_PREFIX:-apt}] installing Debian packages: ${missing[*]}"
  apt_sudo apt-get update -qq
  apt_sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
}
