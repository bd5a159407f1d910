#!/usr/bin/env bash
# The object-store emulators of the test bed, on loopback: fake-gcs-server (a Google Cloud Storage
# API server, built from its Go module) and Azurite's blob service (the Azure Storage emulator,
# from npm), each with one bucket/container, so the drain is exercised against gs:// and az:// the
# way it is against s3:// (s3s-fs, started by hack/local-cluster.sh). And gofakes3, a second S3
# server (built from its Go module, in memory, one bucket): unlike s3s-fs it implements
# ListMultipartUploads, which the operator's pre-attempt clean-up of open uploads relies on.
#
#   hack/store-emulators.sh install  build/install them into the cache (keyed by hack/versions.env)
#   hack/store-emulators.sh up       install if missing, start them (idempotent), create the buckets
#                                    and the container, wait until they answer
#   hack/store-emulators.sh down     stop exactly what `up` started (by PID) and remove their state
#   hack/store-emulators.sh env      print the test settings (`export SANDBOXRUN_TEST_GCS_…`)
#   hack/store-emulators.sh status   exit 0 only when they all answer
#
# State (data, logs, PID files, the GCS service-account file) lives in $SANDBOXRUN_STATE/emulators.
# Ports: GCS_PORT, AZURITE_PORT and GOFAKES3_PORT (hack/lib.sh bed_defaults). hack/local-cluster.sh
# calls up/down/env with the rest of the bed.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=hack/lib.sh
. "$HERE/lib.sh"
bed_defaults
OUT=$CACHE_ROOT/$(emulators_dir_name)
GCS_BIN=$OUT/bin/fake-gcs-server
AZURITE_BIN=$OUT/npm/node_modules/.bin/azurite-blob
GOFAKES3_OUT=$CACHE_ROOT/$(gofakes3_dir_name)
GOFAKES3_BIN=$GOFAKES3_OUT/bin/gofakes3
GOFAKES3_BUCKET=sandboxrun-test
# gofakes3 checks no signature; the operator signs anyway (SigV4), so any pair will do. Test-only.
GOFAKES3_ACCESS_KEY=gofakes3-test
GOFAKES3_SECRET_KEY=gofakes3-test-secret
EM=$STATE/emulators
R=$EM/run; LOGS=$EM/logs
GCS_BUCKET=sandboxrun-test
AZURE_CONTAINER=sandboxrun-test
# A storage account of our own (not Azurite's well-known devstoreaccount1), so the tests show that
# account_name and access_key are honoured. The key is base64, as Azure's are; test-only.
AZURE_ACCOUNT=sandboxrun
AZURE_KEY=c2FuZGJveHJ1bi10ZXN0LWtleS1ub3QtYS1zZWNyZXQtMDEyMzQ1Njc4OQ==
AZURE_API_VERSION=2021-08-06

log() { echo "store-emulators: $*" >&2; }

install() {
  install_gofakes3
  if [ -f "$OUT/.complete" ]; then return 0; fi
  mkdir -p "$OUT/bin" "$OUT/npm"
  if [ ! -x "$GCS_BIN" ]; then
    command -v go >/dev/null || { log "Go is required to build fake-gcs-server"; exit 1; }
    log "building fake-gcs-server $FAKE_GCS_SERVER_VERSION (cached in $OUT)"
    GOBIN=$OUT/bin CGO_ENABLED=0 GOFLAGS="-mod=mod -buildvcs=false" go install -trimpath -ldflags "-s -w" \
      "github.com/fsouza/fake-gcs-server@$FAKE_GCS_SERVER_VERSION"
  fi
  if [ ! -x "$AZURITE_BIN" ]; then
    command -v npm >/dev/null || { log "npm (Node.js >= 18) is required to install Azurite"; exit 1; }
    log "installing azurite $AZURITE_VERSION (cached in $OUT)"
    npm install --prefix "$OUT/npm" --no-audit --no-fund --loglevel=error "azurite@$AZURITE_VERSION" >&2
  fi
  touch "$OUT/.complete"
}

# gofakes3 has a cache directory of its own (hack/lib.sh gofakes3_dir_name).
install_gofakes3() {
  if [ -x "$GOFAKES3_BIN" ]; then return 0; fi
  command -v go >/dev/null || { log "Go is required to build gofakes3"; exit 1; }
  mkdir -p "$GOFAKES3_OUT/bin"
  log "building gofakes3 $GOFAKES3_VERSION (cached in $GOFAKES3_OUT)"
  GOBIN=$GOFAKES3_OUT/bin CGO_ENABLED=0 GOFLAGS="-mod=mod -buildvcs=false" go install -trimpath -ldflags "-s -w" \
    "github.com/johannesboyne/gofakes3/cmd/gofakes3@$GOFAKES3_VERSION"
}

is_running() { [ -f "$R/$1.pid" ] && kill -0 "$(cat "$R/$1.pid")" 2>/dev/null; }
start() {
  local name=$1; shift
  if is_running "$name"; then return 0; fi
  nohup "$@" >"$LOGS/$name.log" 2>&1 </dev/null &
  echo $! >"$R/$name.pid"
}
wait_for() {  # wait_for <what> <seconds> <command...>
  local what=$1 secs=$2; shift 2
  local deadline=$(( $(date +%s) + secs ))
  until "$@" >/dev/null 2>&1; do
    if [ "$(date +%s)" -ge "$deadline" ]; then log "timed out waiting for $what (logs: $LOGS)"; return 1; fi
    sleep 0.5
  done
}

# An Azure Storage request signed with the account's shared key (the REST API's SharedKey scheme),
# path-style as emulators serve it: azure_request <verb> <container> <query> [extra x-ms header].
azure_request() {
  local verb=$1 container=$2 query=$3 extra=${4:-}
  local date; date=$(LC_ALL=C TZ=GMT date '+%a, %d %b %Y %H:%M:%S GMT')
  local headers="x-ms-date:$date"$'\n'"x-ms-version:$AZURE_API_VERSION"
  [ -z "$extra" ] || headers="$extra"$'\n'"$headers"
  local resource="/$AZURE_ACCOUNT/$AZURE_ACCOUNT/$container"
  local q
  for q in $(tr '&' '\n' <<<"$query" | sort); do resource+=$'\n'"${q%%=*}:${q#*=}"; done
  local to_sign="$verb"$'\n\n\n\n\n\n\n\n\n\n\n\n'"$headers"$'\n'"$resource"
  local key_hex; key_hex=$(base64 -d <<<"$AZURE_KEY" | od -An -vtx1 | tr -d ' \n')
  local sig; sig=$(printf '%s' "$to_sign" | openssl dgst -sha256 -mac HMAC -macopt "hexkey:$key_hex" -binary | base64 -w0)
  local args=(-sS -o /dev/null -w '%{http_code}' -X "$verb" -H "x-ms-date: $date" -H "x-ms-version: $AZURE_API_VERSION"
              -H "Authorization: SharedKey $AZURE_ACCOUNT:$sig" -H "Content-Length: 0")
  [ -z "$extra" ] || args+=(-H "${extra%%:*}: ${extra#*:}")
  curl "${args[@]}" "http://127.0.0.1:$AZURITE_PORT/$AZURE_ACCOUNT/$container?$query"
}

# Its listing of open multipart uploads answers (an empty bucket says NoSuchUpload, a 404 with a body).
gofakes3_answers() {
  local code
  code=$(curl -sS -o /dev/null -w '%{http_code}' "http://127.0.0.1:$GOFAKES3_PORT/$GOFAKES3_BUCKET?uploads")
  case "$code" in 200|404) ;; *) return 1 ;; esac
  curl -sSf -o /dev/null "http://127.0.0.1:$GOFAKES3_PORT/$GOFAKES3_BUCKET"
}
gcs_answers() { curl -sSf -o /dev/null "http://127.0.0.1:$GCS_PORT/storage/v1/b/$GCS_BUCKET"; }
azure_answers() { [ "$(azure_request GET "$AZURE_CONTAINER" restype=container)" = 200 ]; }

# The service-account file object_store reads for gs:// (option service_account, or
# GOOGLE_SERVICE_ACCOUNT): fake-gcs-server wants no OAuth, and the file names its base URL.
gcs_service_account() {
  printf '{"disable_oauth": true, "gcs_base_url": "http://127.0.0.1:%s", "client_email": "", "private_key": "", "private_key_id": ""}\n' \
    "$GCS_PORT" >"$EM/gcs-service-account.json"
}

up() {
  install
  mkdir -p "$R" "$LOGS" "$EM/gcs-seed/$GCS_BUCKET" "$EM/gcs-data" "$EM/azurite"
  gcs_service_account
  # -data seeds the bucket (one directory per bucket); -filesystem-root keeps objects on disk, so
  # a stop/start (the outage tests) loses nothing.
  start fake-gcs-server "$GCS_BIN" -scheme http -host 127.0.0.1 -port "$GCS_PORT" \
    -public-host "127.0.0.1:$GCS_PORT" -external-url "http://127.0.0.1:$GCS_PORT" \
    -backend filesystem -filesystem-root "$EM/gcs-data" -data "$EM/gcs-seed" -log-level warn
  start azurite env AZURITE_ACCOUNTS="$AZURE_ACCOUNT:$AZURE_KEY" "$AZURITE_BIN" \
    --blobHost 127.0.0.1 --blobPort "$AZURITE_PORT" --location "$EM/azurite" --disableTelemetry
  # In memory: a test bed's objects are small, and gofakes3 keeps multipart uploads in memory anyway.
  start gofakes3 "$GOFAKES3_BIN" -backend memory -host "127.0.0.1:$GOFAKES3_PORT" \
    -initialbucket "$GOFAKES3_BUCKET"
  wait_for "fake-gcs-server" 60 gcs_answers
  wait_for "azurite" 60 bash -c "exec 3<>/dev/tcp/127.0.0.1/$AZURITE_PORT"
  local code; code=$(azure_request PUT "$AZURE_CONTAINER" restype=container)
  case "$code" in
    201|409) ;;  # created, or already there
    *) log "creating the Azure container failed: HTTP $code (logs: $LOGS)"; exit 1 ;;
  esac
  wait_for "azurite container" 30 azure_answers
  wait_for "gofakes3" 60 gofakes3_answers
  log "up: fake-gcs-server on 127.0.0.1:$GCS_PORT (pid $(cat "$R/fake-gcs-server.pid")), azurite on 127.0.0.1:$AZURITE_PORT (pid $(cat "$R/azurite.pid")), gofakes3 on 127.0.0.1:$GOFAKES3_PORT (pid $(cat "$R/gofakes3.pid"))"
}

down() {
  local name pid
  for name in gofakes3 azurite fake-gcs-server; do
    if is_running "$name"; then
      pid=$(cat "$R/$name.pid")
      kill "$pid" 2>/dev/null || true
      for _ in $(seq 1 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
      kill -9 "$pid" 2>/dev/null || true
    fi
  done
  rm -rf "$EM"
}

env_() {
  echo "export SANDBOXRUN_TEST_GCS_ENDPOINT=http://127.0.0.1:$GCS_PORT"
  echo "export SANDBOXRUN_TEST_GCS_BUCKET=$GCS_BUCKET"
  echo "export SANDBOXRUN_TEST_GCS_SERVICE_ACCOUNT=$EM/gcs-service-account.json"
  echo "export SANDBOXRUN_TEST_GCS_PID_FILE=$R/fake-gcs-server.pid"
  echo "export SANDBOXRUN_TEST_AZURE_ENDPOINT=http://127.0.0.1:$AZURITE_PORT/$AZURE_ACCOUNT"
  echo "export SANDBOXRUN_TEST_AZURE_CONTAINER=$AZURE_CONTAINER"
  echo "export SANDBOXRUN_TEST_AZURE_ACCOUNT=$AZURE_ACCOUNT"
  echo "export SANDBOXRUN_TEST_AZURE_KEY=$AZURE_KEY"
  echo "export SANDBOXRUN_TEST_AZURITE_BIN=$AZURITE_BIN"
  echo "export SANDBOXRUN_TEST_FAKE_GCS_BIN=$GCS_BIN"
  echo "export SANDBOXRUN_TEST_GOFAKES3_URL=http://127.0.0.1:$GOFAKES3_PORT"
  echo "export SANDBOXRUN_TEST_GOFAKES3_BUCKET=$GOFAKES3_BUCKET"
  echo "export SANDBOXRUN_TEST_GOFAKES3_ACCESS_KEY=$GOFAKES3_ACCESS_KEY"
  echo "export SANDBOXRUN_TEST_GOFAKES3_SECRET_KEY=$GOFAKES3_SECRET_KEY"
}

status() {
  gcs_answers || { log "fake-gcs-server does not answer on 127.0.0.1:$GCS_PORT"; return 1; }
  azure_answers || { log "azurite does not answer on 127.0.0.1:$AZURITE_PORT"; return 1; }
  gofakes3_answers || { log "gofakes3 does not answer on 127.0.0.1:$GOFAKES3_PORT"; return 1; }
  log "ok: fake-gcs-server (127.0.0.1:$GCS_PORT), azurite (127.0.0.1:$AZURITE_PORT) and gofakes3 (127.0.0.1:$GOFAKES3_PORT) answer"
}

case "${1:-}" in
  install) install; echo "$OUT"; echo "$GOFAKES3_OUT" ;;
  up) up ;;
  down) down ;;
  env) env_ ;;
  status) status ;;
  *) echo "usage: $0 install|up|down|env|status" >&2; exit 2 ;;
esac
