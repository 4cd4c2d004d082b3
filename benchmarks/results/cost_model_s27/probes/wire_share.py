"""Probe: split the fitted inter-host beta into a wire part and the processors' share.
beta_inter' = f * beta_inter; kappa' = max(kappa, beta_inter * sharing / shift_load), so the shift pattern
that calibrated beta is still predicted the same, but steps with fewer concurrent endpoints run faster.
    python benchmarks/results/cost_model_s27/probes/wire_share.py F [SHAPE_FILTER]
"""
import sys, json, collections, os, dataclasses
from ringlet.tuning.cost import predict_allreduce
from ringlet.tuning.network import Topology, LinkCost
from ringlet.tuning.profile import Profile
f = float(sys.argv[1]); filt = sys.argv[2] if len(sys.argv) > 2 else ''
R = 'benchmarks/results'
sets = []
for shape in ['4x1_1gbit', '2x2_1gbit', '4x1_10gbit', '2x2_10gbit']:
    for lab, d in [('a10', 'cost_model_s23/attempt10'), ('a11', 'cost_model_s24/attempt11'), ('a12', 'cost_model_s25/attempt12')]:
        if os.path.exists(f'{R}/{d}/bench_{shape}.json'):
            sets.append((f'{lab} {shape}', f'{R}/{d}/profile_{shape}.json', [f'{R}/{d}/bench_small_{shape}.json', f'{R}/{d}/bench_{shape}.json']))
for d, shape in [('cost_model_s23/repeat_2x2_1gbit', '2x2_1gbit'), ('cost_model_s23/repeat_2x2_10gbit', '2x2_10gbit'),
                 ('cost_model_s24/repeat_2x2_1gbit', '2x2_1gbit'), ('cost_model_s25/repeat_4x1_10gbit', '4x1_10gbit')]:
    for run in 'AB':
        sets.append((f'{d.split("/")[0][-3:]} rep{run} {shape}', f'{R}/{d}/profile_{shape}.json', [f'{R}/{d}/bench_small_{run}_{shape}.json', f'{R}/{d}/bench_{run}_{shape}.json']))
tot = collections.Counter()
for label, prof, benches in sets:
    if filt not in label or not os.path.exists(benches[1]): continue
    p = Profile.load(prof); top = Topology(p.fingerprint.host_of()); net = p.network
    if '10gbit' in label and net.cpus.scope == 'machine':
        hi = net.links['inter']; sharing = 2 if '2x2' in label else 1
        load = 2 * top.size / net.cpus.cores
        links = dict(net.links); links['inter'] = LinkCost(hi.alpha, hi.beta * f)
        if '2x2' not in label: links['intra'] = links['inter']
        net = dataclasses.replace(net, links=links, kappa=max(net.kappa, hi.beta * sharing / load if f < 1 else 0))
    errs = collections.defaultdict(lambda: ([], []))
    for b in benches:
        for r in json.load(open(b))['rows']:
            e = r.get('extra') or {}
            if 'pred_segment_bytes' not in e: continue
            a = r['impl'][8:]
            pr = predict_allreduce(a, r['size'], top, net, segment_bytes=e['pred_segment_bytes'], checked=True).seconds * 1e6
            m = r[e['pred_against']]
            errs[a][0 if r['size'] >= 1 << 20 else 1].append((pr - m) / m * 100)
    big = {a: sum(map(abs, v[0])) / len(v[0]) for a, v in errs.items()}
    small = {a: sum(map(abs, v[1])) / len(v[1]) for a, v in errs.items()}
    nb = sum(x <= 10 for x in big.values()); ns = sum(x <= 25 for x in small.values())
    tot['big'] += nb; tot['small'] += ns; tot['n'] += len(big)
    print(f"{label:24s} >=1MiB {nb}/7 <1MiB {ns}/7  " + ' '.join(f"{a[:4]}:{big[a]:.1f}" for a in sorted(big)))
print(dict(tot))
