import json, sys, glob, statistics, collections
d = sys.argv[1]
rows = collections.defaultdict(lambda: collections.defaultdict(list))
for f in sorted(glob.glob(f"{d}/*.json")):
    arm = f.split("/")[-1].split("_")[0]
    data = json.load(open(f))
    recs = data["rows"] if isinstance(data, dict) and "rows" in data else data
    for r in recs:
        key = (int(r["size"]), r["impl"])
        rows[key][arm].append(float(r["ip_us"]))
print(f"{'size':>10} {'impl':32} {'old us (runs)':>28} {'new us (runs)':>28} new/old")
for key in sorted(rows):
    o, n = rows[key]["old"], rows[key]["new"]
    print(f"{key[0]:>10} {key[1]:32} {statistics.median(o):10.1f} {str([round(x) for x in o]):>17} {statistics.median(n):10.1f} {str([round(x) for x in n]):>17} {statistics.median(n)/statistics.median(o):.3f}")
