#!/usr/bin/env bash
# Installs Debian's Chromium and its chromedriver when they are missing, for the console's browser tests
# (tests/gateway/test_console_browser.py drives a headless Chromium with Selenium). A user of strom never
# needs them: the console is plain HTML any browser shows.
#
# Does nothing when both are installed. When they are missing and apt cannot be used, it says so and exits
# 0: the browser tests then skip, naming the reason.
set -euo pipefail

if command -v chromium > /dev/null && command -v chromedriver > /dev/null; then
    echo "install-chromium: Chromium and chromedriver are installed"
    exit 0
fi
# shellcheck source=scripts/apt-install.sh
. "$(dirname "$0")/apt-install.sh"
if apt_install chromium chromium-driver; then
    echo "install-chromium: installed Debian's chromium and chromium-driver packages"
else
    echo "install-chromium: Chromium is not installed (the console's browser tests skip)"
fi
