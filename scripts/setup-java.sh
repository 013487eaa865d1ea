#!/usr/bin/env bash
# Install a headless Java runtime when missing, for the tests under tests/spark (pyspark starts
# a JVM). Needs root and apt-get; elsewhere those tests skip, saying why.
set -euo pipefail
if command -v java >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "setup-java: not root or no apt-get: no Java installed; tests/spark will skip" >&2
    exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >&2
apt-get install -y -qq openjdk-17-jre-headless >&2
