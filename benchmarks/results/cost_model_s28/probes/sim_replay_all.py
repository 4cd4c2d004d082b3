"""The simulator against every sweep kept since session 25 (attempts 12-17), each replayed with its own
calibration profile at the segments it ran: sim MAE at >= 1 MiB per algorithm, and how many of 7 are
within 15%. Run with the ringlet to judge on the path:
    python benchmarks/results/cost_model_s28/probes/sim_replay_all.py
sim_replay_all_before.txt is commit 9b1b77f, sim_replay_all_after.txt commit 710a5cf."""
import json, os, sys, collections
from ringlet.sim import simulate
from ringlet.tuning.network import Topology
from ringlet.tuning.profile import Profile
R = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..')
atts=[('a12','cost_model_s25/attempt12'),('a13','cost_model_s27/attempt13'),('a14','cost_model_s27/attempt14'),('a15','cost_model_s27/attempt15'),('a16','cost_model_s27/attempt16'),('a17','cost_model_s28/attempt17')]
tot=collections.Counter()
for lab,d in atts:
    for s in ['4x1_1gbit','2x2_1gbit','4x1_10gbit','2x2_10gbit']:
        if not os.path.exists(f'{R}/{d}/bench_{s}.json'): continue
        p=Profile.load(f'{R}/{d}/profile_{s}.json'); top=Topology(p.fingerprint.host_of()); net=p.network
        errs=collections.defaultdict(list); small=collections.defaultdict(list)
        for b in [f'{R}/{d}/bench_small_{s}.json', f'{R}/{d}/bench_{s}.json']:
            for r in json.load(open(b))['rows']:
                e=r.get('extra') or {}
                if 'pred_segment_bytes' not in e or not r['ip_us']>0: continue
                a=r['impl'][8:]
                sec=simulate('allreduce',a,r['size'],top,net,e['pred_segment_bytes'],itemsize=4).seconds+net.check
                err=abs(sec*1e6-r['ip_us'])/r['ip_us']
                (errs if r['size']>=1<<20 else small)[a].append(err)
        mae={a:100*sum(v)/len(v) for a,v in errs.items()}
        n=sum(x<=15 for x in mae.values()); tot['ok']+=n; tot['n']+=len(mae)
        print(f"{lab} {s:11s} {n}/7  "+' '.join(f"{a[:4]}{v:.1f}" for a,v in sorted(mae.items())))
print(dict(tot))
