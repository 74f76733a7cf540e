#!/usr/bin/env bash
# Install ledgerd as a supervised service on a Debian host (idempotent), or remove it.
#
#   sudo systemd/install.sh                  # from this checkout (or: --wheel FILE)
#   sudo systemd/install.sh --uninstall      # units and /opt/ledgerd go; config and data stay
#   systemd/install.sh --root DIR            # into a scratch root (tests, image builds)
#   sudo PYTHON=/usr/bin/python3 systemd/install.sh   # the interpreter /opt/ledgerd is built on
#
# PYTHON (default: python3 on PATH) must be runnable by the service user: the virtualenv
# links to it. One in root's home (pyenv, conda) is not; the install checks, as that user,
# before it builds anything and again before it says done (--user NAME checks another
# user, also into a scratch root).
#
# What it lays down (each step skipped when already done; an edited config is never
# overwritten):
#   /opt/ledgerd                      a virtualenv with ledgerd (bin/ledgerd), and its docs
#                                     under share/doc/ledgerd (the units link to them)
#   /etc/ledgerd/bookie.toml          from systemd/bookie.toml, then edit it
#   /etc/ledgerd/bookie.env           LEDGERD_<KEY> overrides (optional)
#   /var/lib/ledgerd                  data (journal and ledger devices mount here), owned
#                                     by the ledgerd system user
#   /etc/systemd/system/ledgerd-bookie.service, ledgerd-bookie@.service (several bookies
#                                     per host), ledgerd-autorecovery.service,
#                                     ledgerd-metadata-snapshot.service and .timer
#                                     (hourly metadata snapshots; enable the timer)
# and, on systemd >= 254, a drop-in that backs restarts off from 15 s to 5 min.
# Nothing is started: `systemctl enable --now ledgerd-bookie` once the config is right.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
checkout="$(dirname "$here")"
root=""
wheel=""
uninstall=0
user=""
python="${PYTHON:-python3}"

usage() { sed -n '2,25p' "$0" | sed 's/^# \{0,1\}//'; }
die() { echo "install.sh: $*" >&2; exit 2; }

while [ $# -gt 0 ]; do
    case "$1" in
        --root) root="${2:?--root needs a directory}"; shift 2 ;;
        --root=*) root="${1#--root=}"; shift ;;
        --wheel) wheel="${2:?--wheel needs a file}"; shift 2 ;;
        --uninstall) uninstall=1; shift ;;
        --user) user="${2:?--user needs a name}"; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *) die "unknown argument '$1' (see --help)" ;;
    esac
done
[ -z "$root" ] || root="$(cd "$root" 2>/dev/null && pwd)" || die "--root: no such directory"
[ -z "$wheel" ] || [ -f "$wheel" ] || die "--wheel: no such file: $wheel"
if [ -z "$root" ] && [ "$(id -u)" != 0 ]; then
    die "installing into / needs root (or give --root DIR)"
fi

prefix="$root/opt/ledgerd"
etc="$root/etc/ledgerd"
data="$root/var/lib/ledgerd"
units="$root/etc/systemd/system"
say() { echo "ledgerd install: $*"; }

systemd_live() { [ -z "$root" ] && [ -d /run/systemd/system ]; }

if [ "$uninstall" = 1 ]; then
    if systemd_live; then
        systemctl disable --now ledgerd-bookie.service ledgerd-autorecovery.service \
            ledgerd-gateway.service ledgerd-metadata-snapshot.timer \
            >/dev/null 2>&1 || true
    fi
    for u in ledgerd-bookie.service ledgerd-bookie@.service ledgerd-autorecovery.service ledgerd-gateway.service \
            ledgerd-metadata-snapshot.service ledgerd-metadata-snapshot.timer; do
        [ -e "$units/$u" ] && rm -f "$units/$u" && say "removed $units/$u"
    done
    rm -rf "$units/ledgerd-bookie.service.d" "$units/ledgerd-bookie@.service.d" \
        "$units/ledgerd-autorecovery.service.d"
    [ -d "$prefix" ] && rm -rf "$prefix" && say "removed $prefix"
    if systemd_live; then systemctl daemon-reload; fi
    say "kept $etc (configuration) and $data (data); remove them by hand if you mean it"
    exit 0
fi

# 1. The system user (on the live host only: a scratch root has no user database).
if [ -z "$root" ]; then
    if ! getent passwd ledgerd >/dev/null; then
        useradd --system --home-dir /var/lib/ledgerd --no-create-home \
            --shell /usr/sbin/nologin --user-group ledgerd
        say "created system user ledgerd"
    fi
fi

# 2. The virtualenv and the product, on an interpreter the service user can run.
[ -n "$user" ] || [ -n "$root" ] || user=ledgerd
as_user() { runuser -u "$user" -- "$@"; }
if [ -n "$user" ] && [ ! -x "$prefix/bin/python" ]; then
    interp="$(command -v "$python" || true)"
    [ -n "$interp" ] || die "PYTHON=$python: not found"
    if ! why="$(cd / && as_user "$interp" -c 'import venv, ensurepip' 2>&1)"; then
        die "the service user $user cannot run $interp ($(readlink -f "$interp")): \
$(printf '%s' "$why" | tail -n 1). Give an interpreter outside any home directory: \
PYTHON=/usr/bin/python3 $0"
    fi
fi
if [ ! -x "$prefix/bin/python" ]; then
    mkdir -p "$(dirname "$prefix")"
    "$python" -m venv "$prefix"
    say "created virtualenv $prefix"
fi
source_spec="${wheel:-$checkout}"
installed="$("$prefix/bin/python" -c 'import importlib.metadata as m; print(m.version("ledgerd"))' \
    2>/dev/null || true)"
stamp="$prefix/.installed-from"
want="$(if [ -n "$wheel" ]; then sha256sum "$wheel" | cut -d' ' -f1; \
        else git -C "$checkout" rev-parse HEAD 2>/dev/null || echo unknown; fi)"
if [ -z "$installed" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ] || [ "$want" = unknown ]; then
    constraints=()
    [ -f "$checkout/constraints.txt" ] && constraints=(-c "$checkout/constraints.txt")
    "$prefix/bin/pip" install -q --disable-pip-version-check "${constraints[@]}" "$source_spec"
    echo "$want" > "$stamp"
    say "installed ledgerd into $prefix ($source_spec)"
fi
"$prefix/bin/ledgerd" --help >/dev/null || die "$prefix/bin/ledgerd does not run"
mkdir -p "$prefix/share/doc/ledgerd"
cp "$checkout"/docs/*.md "$prefix/share/doc/ledgerd/" 2>/dev/null || true
if [ -d "$checkout/docs/grafana" ]; then
    mkdir -p "$prefix/share/doc/ledgerd/grafana"
    cp "$checkout"/docs/grafana/*.json "$prefix/share/doc/ledgerd/grafana/"
fi

# 3. Configuration (never overwritten) and data.
mkdir -p "$etc" "$data"
for f in bookie.toml bookie.env gateway.toml; do
    if [ ! -e "$etc/$f" ]; then
        install -m 0640 "$here/$f" "$etc/$f"
        say "wrote $etc/$f (edit it)"
    fi
done
if [ ! -e "$etc/autorecovery.toml" ]; then
    ln -s bookie.toml "$etc/autorecovery.toml"
fi
chmod 0750 "$data"
if [ -z "$root" ]; then
    chown ledgerd:ledgerd "$data"
    chgrp ledgerd "$etc" "$etc"/*.toml "$etc"/*.env 2>/dev/null || true
fi

# 4. Units (always refreshed: they belong to the product, not to the operator).
mkdir -p "$units"
for u in ledgerd-bookie.service ledgerd-bookie@.service ledgerd-autorecovery.service ledgerd-gateway.service \
        ledgerd-metadata-snapshot.service ledgerd-metadata-snapshot.timer; do
    if ! cmp -s "$here/$u" "$units/$u"; then
        install -m 0644 "$here/$u" "$units/$u"
        say "installed $units/$u"
    fi
done
version="$(systemctl --version 2>/dev/null | awk 'NR==1 {print $2}')"
if [ -n "$version" ] && [ "$version" -ge 254 ] 2>/dev/null; then
    for u in ledgerd-bookie.service ledgerd-bookie@.service ledgerd-autorecovery.service ledgerd-gateway.service; do
        mkdir -p "$units/$u.d"
        printf '[Service]\nRestartSteps=6\nRestartMaxDelaySec=300\n' > "$units/$u.d/backoff.conf"
    done
fi
if systemd_live; then
    systemctl daemon-reload
fi
if [ -z "$root" ]; then
    # What the unit will do, as the user it runs as: run the installed interpreter.
    if ! why="$(cd / && as_user "$prefix/bin/ledgerd" --version 2>&1)"; then
        die "the service user $user cannot run $prefix/bin/ledgerd: \
$(printf '%s' "$why" | tail -n 1). Its interpreter is $(readlink -f "$prefix/bin/python"); \
reinstall with one outside any home directory: --uninstall, then PYTHON=/usr/bin/python3 $0"
    fi
fi
say "done: edit $etc/bookie.toml, then: systemctl enable --now ledgerd-bookie"
