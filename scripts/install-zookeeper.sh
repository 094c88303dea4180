#!/usr/bin/env bash
# Installs Debian's ZooKeeper package (server jars under /usr/share/zookeeper) when it is missing, for the
# tests and the local development cluster. strom starts its own throw-away server from these jars
# (strom/zk/zookeeper_server.py); the package's system service is not used.
#
# Does nothing when ZooKeeper is already installed. When it is missing and apt cannot be used (not
# Debian/Ubuntu, or not root and no password-less sudo), it says so and exits 0: the tests that need
# ZooKeeper then skip, naming the reason.
set -euo pipefail

if [ -f /usr/share/java/zookeeper.jar ]; then
    echo "install-zookeeper: ZooKeeper is installed"
    exit 0
fi
if ! command -v apt-get > /dev/null; then
    echo "install-zookeeper: no apt-get on this machine; install ZooKeeper 3.8 yourself (tests that need it skip)"
    exit 0
fi
if [ "$(id -u)" -eq 0 ]; then
    SUDO=()
elif command -v sudo > /dev/null && sudo -n true 2> /dev/null; then
    SUDO=(sudo -n)
else
    echo "install-zookeeper: not root and no password-less sudo; run: sudo apt-get install zookeeper"
    exit 0
fi

export DEBIAN_FRONTEND=noninteractive
if ! apt-cache show zookeeper > /dev/null 2>&1; then
    "${SUDO[@]}" apt-get update -q || true
fi
# Only the package with the jars: zookeeperd would also start a system-wide server on port 2181.
if "${SUDO[@]}" apt-get install -y -q --no-install-recommends zookeeper; then
    echo "install-zookeeper: installed Debian's zookeeper package"
else
    echo "install-zookeeper: apt-get could not install zookeeper (tests that need it skip)"
fi
