set -e
cd /work/main; source .venv/bin/activate
ringlet cluster up --hosts 4 --link 1gbit --burst port --replace
B="ringlet bench --no-progress --cluster --transport torch --algorithms ring,recursive_doubling,tree,halving_doubling -b 64K -e 16M -f 4 -n 40"
stat() { head -1 /proc/stat; }
echo "== port 96K"; stat; $B; stat
ringlet cluster linktest --seconds 3 h0:h1
for i in 0 1 2 3; do
  ip -n rgl-h$i link set dev eth0 gso_max_size ${GSO:-16384}
  ip link set dev rgl-v$i gso_max_size ${GSO:-16384}
  tc -n rgl-h$i qdisc change dev eth0 root tbf rate 1gbit burst ${BUCKET:-32768} latency 50ms
  tc qdisc change dev rgl-v$i root tbf rate 1gbit burst ${BUCKET:-32768} latency 50ms
done
tc -n rgl-h0 qdisc show dev eth0; ip -n rgl-h0 -d link show eth0 | grep -o "gso_max_size [0-9]*"
echo "== gso ${GSO:-16384} burst ${BUCKET:-32768}"; stat; $B; stat
ringlet cluster linktest --seconds 3 h0:h1
ringlet cluster down
