#!/usr/bin/env bash
# Three Bastion replicas behind nginx on this machine, in the foreground (docs/deploy.md).
#
#   deploy/run-replicas.sh CONFIG.toml [DATA_DIR]
#
# Replicas listen on 127.0.0.1:8701-8703 (generations gateway-1..3, one shared store in
# DATA_DIR, or BASTION_STORE when set), nginx on 127.0.0.1:8700 with deploy/nginx/bastion.conf.
# Ctrl-C stops everything. Needs nginx (Debian: apt-get install -y nginx) and `bastion` on PATH.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
config="${1:?usage: run-replicas.sh CONFIG.toml [DATA_DIR]}"
data_dir="${2:-./bastion-data}"
prefix="$(mktemp -d -t bastion-nginx.XXXXXX)"
mkdir -p "$prefix/logs" "$data_dir"
pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait || true
    rm -rf "$prefix"
}
trap cleanup EXIT INT TERM
for n in 1 2 3; do
    bastion serve --config "$config" --data-dir "$data_dir" --host 127.0.0.1 --port "870$n" \
        --generation "gateway-$n" --log-level info 2>>"$data_dir/replica-$n.log" &
    pids+=("$!")
done
# nginx as a foreground process of this script, with its own prefix (no system service).
sed -e "s#/var/log/nginx/bastion.access.log#$prefix/logs/access.log#" "$here/nginx/bastion.conf" \
    >"$prefix/bastion.conf"
user_line=""
if [ "$(id -u)" = 0 ]; then user_line="user root;"; fi   # workers must reach the temp prefix
cat >"$prefix/nginx.conf" <<CONF
daemon off;
$user_line
worker_processes 1;
pid $prefix/nginx.pid;
error_log $prefix/logs/error.log warn;
events { worker_connections 1024; }
http {
    client_body_temp_path $prefix/client_body;
    proxy_temp_path $prefix/proxy;
    fastcgi_temp_path $prefix/fastcgi;
    uwsgi_temp_path $prefix/uwsgi;
    scgi_temp_path $prefix/scgi;
    include $prefix/bastion.conf;
}
CONF
nginx -p "$prefix" -c "$prefix/nginx.conf" &
pids+=("$!")
echo "Bastion behind nginx: http://127.0.0.1:8700/mcp (access log: $prefix/logs/access.log)"
wait -n
