#!/usr/bin/env bash
# Downloads (here, where Debian's registry is reachable) the Debian 12 packages the build needs
# beyond what the GPU machine has (it has python3 + torch 2.11 + nvcc + cmake + ninja, but no
# gRPC/Protobuf/GoogleTest/nlohmann-json/spdlog/PCRE2), with their library dependencies, into
# .deps/debs. scripts/gpu-check.sh unpacks them there with `dpkg -x`. The folder is git-ignored
# and travels with `carry: [".deps"]`.
set -euo pipefail
cd "$(dirname "$0")/.."
readonly ROOTS=(
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libgtest-dev libgmock-dev nlohmann-json3-dev libspdlog-dev libpcre2-dev libyaml-cpp-dev
  libcpp-httplib-dev libxxhash-dev
)
mkdir -p .deps/debs
cd .deps/debs
# Every package the roots depend on, minus the base system (libc, libstdc++, gcc runtime), which
# the GPU machine's newer OS provides.
mapfile -t pkgs < <(apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts \
    --no-breaks --no-replaces --no-enhances "${ROOTS[@]}" |
  grep -v '^ ' | grep -v '^<' | sort -u |
  grep -vE '^(libc6|libc6-dev|libgcc-s1|libstdc\+\+6|libstdc\+\+-12-dev|gcc-12-base|libc-dev-bin|linux-libc-dev|libcrypt1|libcrypt-dev|debconf|dpkg|perl-base|tar|coreutils|libselinux1|zlib1g|libzstd1|liblzma5|libbz2-1.0|libgcc-12-dev|gcc|g\+\+|cpp|binutils.*|libnsl.*|libtirpc.*|rpcsvc-proto|.*:i386)$')
apt-get download "${pkgs[@]}" >/dev/null
ls *.deb | wc -l
du -sh .
