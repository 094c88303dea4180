# Sourced by the install scripts: apt_install PACKAGE... installs Debian packages where apt can be used here.
#
# Returns 0 once they are installed, 1 when they cannot be (no apt-get, not root and no password-less sudo,
# or apt-get failed), after saying why on stderr; the caller decides what strom does without them.

apt_install() {
    local sudo=()
    if ! command -v apt-get > /dev/null; then
        echo "no apt-get on this machine; install $* yourself" >&2
        return 1
    fi
    if [ "$(id -u)" -ne 0 ]; then
        if command -v sudo > /dev/null && sudo -n true 2> /dev/null; then
            sudo=(sudo -n)
        else
            echo "not root and no password-less sudo; run: sudo apt-get install $*" >&2
            return 1
        fi
    fi
    export DEBIAN_FRONTEND=noninteractive
    # the package lists are refreshed only when a first try finds a package unknown or out of date
    if "${sudo[@]}" apt-get install -y -q --no-install-recommends "$@" > /dev/null 2>&1; then
        return 0
    fi
    "${sudo[@]}" apt-get update -q > /dev/null 2>&1 || true
    if ! "${sudo[@]}" apt-get install -y -q --no-install-recommends "$@" > /dev/null; then
        echo "apt-get could not install $*" >&2
        return 1
    fi
}
