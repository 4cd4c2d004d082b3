# Sourced by prediction_suite.sh and repeat_suite.sh after `cd` to the repository and OUT set: the
# algorithms swept, the emulated cluster taken down on exit, and the two steps of every shape.
CLUSTER=(.venv/bin/ringlet cluster)
ALGOS=auto,ring,tree,halving_doubling,recursive_doubling,direct,hierarchical,torus
trap '"${CLUSTER[@]}" down >/dev/null 2>&1 || true' EXIT
# The links' token buckets (`ringlet cluster up --burst`): unset, `port` (the smallest that holds the rate,
# 96K at 1 Gbit/s and 256K at 10 Gbit/s, as measured on the emulated links); bytes such as 96K; empty (BURST=)
# for the emulator's default of 2 ms of traffic.
BURST=${BURST-port}

# calibrate SHAPE: bring the cluster up as SHAPE (HOSTSxRANKS_LINK, e.g. 4x1_1gbit; with BURST's buckets)
# and `ringlet tune` it into
# $OUT/profile_SHAPE.json (transcript in $OUT/tune_SHAPE.txt).
calibrate() {
  local shape=$1 hosts rest per link prof
  hosts=${shape%%x*}; rest=${shape#*x}; per=${rest%%_*}; link=${rest#*_}; prof="$OUT/profile_$shape.json"
  "${CLUSTER[@]}" up --hosts "$hosts" --ranks-per-host "$per" --link "$link" ${BURST:+--burst "$BURST"} --replace >/dev/null
  { echo "\$ ringlet tune --cluster --transport torch --out $prof"
    /usr/bin/time -f "wall %e s" .venv/bin/ringlet tune --cluster --transport torch --out "$prof"; } 2>&1 | tee "$OUT/tune_$shape.txt"
}

# sweep SHAPE NAME FIRST-SIZE LAST-SIZE [bench args...]: every algorithm and `auto` with SHAPE's profile
# installed, predictions beside the measurements, into $OUT/NAME_SHAPE.{txt,json}.
sweep() {
  local shape=$1 name=$2 b=$3 e=$4 prof="$OUT/profile_$1.json"; shift 4
  { echo "\$ RINGLET_PROFILE=$prof ringlet bench --cluster --transport torch --algorithms $ALGOS -b $b -e $e -f 4 $* --predict $prof"
    RINGLET_PROFILE="$prof" .venv/bin/ringlet bench --no-progress --cluster --transport torch --algorithms "$ALGOS" \
      -b "$b" -e "$e" -f 4 "$@" --predict "$prof" --json "$OUT/${name}_$shape.json"; } 2>&1 | tee "$OUT/${name}_$shape.txt"
}
