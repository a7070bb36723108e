# Shared settings for the project's scripts; sourced, never run.
# TRAINER_CACHE holds the LibTorch virtualenv that every clone on this machine reuses.
TORCH_VERSION="${TORCH_VERSION:-2.11.0}"
TRAINER_CACHE="${TRAINER_CACHE:-$HOME/.cache/trainer}"
TRAINER_VENV="${TRAINER_VENV:-$TRAINER_CACHE/torch-$TORCH_VERSION}"
BUILD_DIR="${BUILD_DIR:-build}"
export CCACHE_DIR="${CCACHE_DIR:-$HOME/.cache/ccache}"
# Paths under the clone are hashed relative to it, so clones and build directories share hits.
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}"
# PCH-friendly ccache settings (the precompiled header is included with -include).
export CCACHE_SLOPPINESS="${CCACHE_SLOPPINESS:-pch_defines,time_macros,include_file_mtime,include_file_ctime}"

# Open MPI refuses root and >cores ranks unless told; containers lack CMA for vader.
if [ "$(id -u)" = 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
export OMPI_MCA_btl_vader_single_copy_mechanism="${OMPI_MCA_btl_vader_single_copy_mechanism:-none}"
export OMPI_MCA_rmaps_base_oversubscribe="${OMPI_MCA_rmaps_base_oversubscribe:-1}"

# The Debian packages scripts/packages.txt marks with $1 (host or device), one a line.
debian_packages() {
  local list
  list="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/packages.txt"
  awk -v want="$1" '{ sub(/#.*/, "") } NF { for (i = 2; i <= NF; ++i) if ($i == want) print $1 }' "$list"
}

# Installs whichever of the Debian packages "$@" are missing (as root, or through sudo).
install_debian_packages() {
  local missing=() p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  echo "[packages] installing Debian packages: ${missing[*]}"
  local sudo=()
  [ "$(id -u)" = 0 ] || sudo=(sudo)
  "${sudo[@]}" apt-get update -qq
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}
