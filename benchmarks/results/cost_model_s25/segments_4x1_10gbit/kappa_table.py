"""The segment sweep of this folder predicted again at several kappa (ns/B), offline:
    python benchmarks/results/cost_model_s25/segments_4x1_10gbit/kappa_table.py \
        benchmarks/results/cost_model_s25/segments_4x1_10gbit/profile.json \
        benchmarks/results/cost_model_s25/segments_4x1_10gbit/sweep.txt
"""
import sys, os, json, dataclasses
from ringlet.tuning.cost import predict_allreduce
from ringlet.tuning.network import Network, Topology
prof, txt = sys.argv[1], sys.argv[2]
d=json.load(open(prof)); net0=Network.from_dict(d['network'])
rows=[]
for line in open(txt):
    if line.startswith('# '):
        h=line[line.index('['):line.index(']')+1]; hosts=tuple(json.loads(h)); continue
    f=line.split()
    if len(f)==7 and f[0].isdigit(): rows.append((int(f[0]),f[1],int(f[2]),float(f[3])))
top=Topology(hosts)
ks=[0,0.3e-9,0.5e-9,0.6e-9,0.8e-9]
print(f"{'size':>9} {'alg':5} {'seg':>8} {'meas':>7} "+' '.join(f"k{k*1e9:<6.2f}" for k in ks))
tot={k:[] for k in ks}
for n,a,s,m in rows:
    out=[]
    for k in ks:
        net=dataclasses.replace(net0,kappa=k)
        pr=predict_allreduce(a,n,top,net,segment_bytes=s).seconds*1e3
        out.append(f"{(pr-m)/m*100:+6.1f} "); tot[k].append(abs(pr-m)/m*100)
    print(f"{n:>9} {a[:5]:5} {s:>8} {m:7.1f} "+' '.join(out))
print('MAE', {k: round(sum(v)/len(v),1) for k,v in tot.items()})
