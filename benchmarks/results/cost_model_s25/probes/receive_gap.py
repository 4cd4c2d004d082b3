"""Probe, not adopted (README section 5): a step in which some rank receives again after a step without
receives starts a new pipeline stage in the cost model (the executor posts that rank's receives only once
its earlier steps are applied). Re-predicts 18 measured sweeps at the segments they ran:
    python benchmarks/results/cost_model_s25/probes/receive_gap.py base   # the model of e070f0c
    python benchmarks/results/cost_model_s25/probes/receive_gap.py gap    # with the rule
"""
import sys, json, collections, numpy as np
import ringlet.tuning.signature as sg
from ringlet.tuning.cost import predict_allreduce
from ringlet.tuning.network import Topology
from ringlet.tuning.profile import Profile
orig = sg.held_between
if sys.argv[1] == 'gap':
    of = sg.Signature.of
    def patched(schedule, topology, reference=1):
        seen = np.zeros(schedule.nranks, bool); prevr = np.zeros(schedule.nranks, bool); gaps = set()
        for s in range(schedule.num_steps):
            a = schedule.step_arrays(s); r = np.zeros(schedule.nranks, bool); r[a.dst] = True
            if (r & ~prevr & seen).any(): gaps.add(s)
            seen |= r; prevr = r
        calls = {'i': 0}
        def hb(prev, cur, p):
            calls['i'] += 1
            return np.array([0]) if calls['i'] in gaps else orig(prev, cur, p)
        sg.held_between = hb
        try: return of(schedule, topology, reference)
        finally: sg.held_between = orig
    sg.Signature.of = staticmethod(patched)
R='benchmarks/results'
sets=[]
for shape in ['4x1_1gbit','2x2_1gbit','4x1_10gbit','2x2_10gbit']:
    for lab, d in [('a10','cost_model_s23/attempt10'),('a11','cost_model_s24/attempt11'),('a12','cost_model_s25/attempt12')]:
        import os
        if os.path.exists(f'{R}/{d}/bench_{shape}.json'):
            sets.append((f'{lab} {shape}', f'{R}/{d}/profile_{shape}.json', [f'{R}/{d}/bench_small_{shape}.json', f'{R}/{d}/bench_{shape}.json']))
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
    print(f"{label:24s} >=1MiB {nb}/7  <1MiB {ns}/7  tree {big['tree']:.1f} small-tree {small['tree']:.1f}")
print(dict(tot))
