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
# shellcheck source=scripts/apt-install.sh
. "$(dirname "$0")/apt-install.sh"
# Only the package with the jars: zookeeperd would also start a system-wide server on port 2181.
if apt_install zookeeper; then
    echo "install-zookeeper: installed Debian's zookeeper package"
else
    echo "install-zookeeper: ZooKeeper is not installed (tests that need it skip)"
fi
