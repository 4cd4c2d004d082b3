import sys, json, collections, glob, os
sys.path.insert(0, '/tmp/exp')
import ringlet.tuning.cost as cost
import ringlet.tuning.signature as sigmod
from ringlet.tuning.cost import predict_allreduce
from ringlet.tuning.network import Topology
from ringlet.tuning.profile import Profile
EXP = len(sys.argv) > 1 and sys.argv[1] == 'eps'
if EXP:
    import sigeps
    cost.Signature = sigeps.Signature
R='benchmarks/results'
sets=[]
for shape in ['4x1_1gbit','2x2_1gbit','4x1_10gbit','2x2_10gbit']:
    sets.append((f'a10 {shape}', f'{R}/cost_model_s23/attempt10/profile_{shape}.json', [f'{R}/cost_model_s23/attempt10/bench_small_{shape}.json', f'{R}/cost_model_s23/attempt10/bench_{shape}.json']))
    sets.append((f'a11 {shape}', f'{R}/cost_model_s24/attempt11/profile_{shape}.json', [f'{R}/cost_model_s24/attempt11/bench_small_{shape}.json', f'{R}/cost_model_s24/attempt11/bench_{shape}.json']))
for d, shape in [('cost_model_s23/repeat_2x2_1gbit','2x2_1gbit'),('cost_model_s23/repeat_2x2_10gbit','2x2_10gbit'),('cost_model_s24/repeat_2x2_1gbit','2x2_1gbit')]:
    for run in 'AB':
        sets.append((f'{d.split("/")[0][-3:]} rep{run} {shape}', f'{R}/{d}/profile_{shape}.json', [f'{R}/{d}/bench_small_{run}_{shape}.json', f'{R}/{d}/bench_{run}_{shape}.json']))
tot=collections.Counter()
for label, prof, benches in sets:
    p = Profile.load(prof); top = Topology(p.fingerprint.host_of())
    errs = collections.defaultdict(lambda: ([], []))
    for b in benches:
        for r in json.load(open(b))['rows']:
            e = r.get('extra') or {}
            if 'pred_segment_bytes' not in e: continue
            a = r['impl'][8:]
            pr = predict_allreduce(a, r['size'], top, p.network, segment_bytes=e['pred_segment_bytes'], checked=True).seconds*1e6
            m = r[e['pred_against']]
            errs[a][0 if r['size'] >= 1<<20 else 1].append(abs(pr-m)/m*100)
    big = {a: sum(v[0])/len(v[0]) for a, v in errs.items()}
    small = {a: sum(v[1])/len(v[1]) for a, v in errs.items()}
    nb = sum(x <= 10 for x in big.values()); ns = sum(x <= 25 for x in small.values())
    tot['big'] += nb; tot['small'] += ns; tot['n'] += len(big)
    print(f"{label:24s} >=1MiB {nb}/7  <1MiB {ns}/7  " + ' '.join(f"{a[:4]}:{big[a]:.1f}" for a in sorted(big)))
print(dict(tot))
