set -e
cd /work/main; source .venv/bin/activate
ringlet cluster up --hosts 2 --ranks-per-host 2 --link 10gbit --burst 256K --replace
for i in 1 2 3 4; do
  for arm in old new; do
    cp /tmp/cal_$arm.py src/ringlet/tuning/calibrate.py
    ringlet tune --cluster --transport torch --out /tmp/tunes/${arm}_$i.json > /tmp/tunes/${arm}_$i.txt 2>&1
    grep "large call\|per-byte" /tmp/tunes/${arm}_$i.txt | sed "s/^/$arm $i: /"
  done
done
cp /tmp/cal_new.py src/ringlet/tuning/calibrate.py
ringlet cluster down
