"""The per-class processor price (tuning/wire.py split_kappa) applied offline to every measured sweep
kept since session 23: each profile's own step-7 timings (info["large_calls"]) go through split_kappa,
and every row is predicted again at the segment it ran. ``base``: the profiles as saved.
    python benchmarks/results/cost_model_s27/probes/per_class_refit.py base|split [FILTER]
"""
import sys, json, collections, os
from ringlet.tuning.calibrate import large_call_predictor
from ringlet.tuning.cost import predict_allreduce
from ringlet.tuning.network import Topology
from ringlet.tuning.profile import Profile
from ringlet.tuning.wire import split_kappa
mode = sys.argv[1]; filt = sys.argv[2] if len(sys.argv) > 2 else ''
R = 'benchmarks/results'
sets = []
for shape in ['4x1_1gbit', '2x2_1gbit', '4x1_10gbit', '2x2_10gbit']:
    for lab, d in [('a10', 'cost_model_s23/attempt10'), ('a11', 'cost_model_s24/attempt11'), ('a12', 'cost_model_s25/attempt12'), ('a13', 'cost_model_s27/attempt13')]:
        if os.path.exists(f'{R}/{d}/bench_{shape}.json'):
            sets.append((f'{lab} {shape}', f'{R}/{d}/profile_{shape}.json', [f'{R}/{d}/bench_small_{shape}.json', f'{R}/{d}/bench_{shape}.json']))
for d, shape in [('cost_model_s23/repeat_2x2_1gbit', '2x2_1gbit'), ('cost_model_s23/repeat_2x2_10gbit', '2x2_10gbit'),
                 ('cost_model_s24/repeat_2x2_1gbit', '2x2_1gbit'), ('cost_model_s25/repeat_4x1_10gbit', '4x1_10gbit')]:
    for run in 'AB':
        sets.append((f'{d.split("/")[0][-3:]} rep{run} {shape}', f'{R}/{d}/profile_{shape}.json', [f'{R}/{d}/bench_small_{run}_{shape}.json', f'{R}/{d}/bench_{run}_{shape}.json']))
tot = collections.Counter()
for label, prof, benches in sets:
    if filt not in label: continue
    p = Profile.load(prof); host_of = p.fingerprint.host_of(); top = Topology(host_of); net = p.network
    large = dict(p.info.get('large_calls') or {}); fit = large.pop('fit', None)
    note = ''
    if mode == 'split' and fit:
        calls = {k: (v.get('algorithm', k), v.get('segment_bytes')) for k, v in large.items()}
        pred = large_call_predictor(net, top, fit['bytes'], calls)
        net, seen = split_kappa(net, host_of, [v['measured'] for v in large.values()], pred.under)
        if seen.get('split'):
            note = f"kappa {seen['single']*1e9:.2f} -> {net.kappa*1e9:.2f}/{net.kx*1e9:.2f}"
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
    print(f"{label:22s} >=1MiB {nb}/7 <1MiB {ns}/7  " + ' '.join(f"{a[:4]}:{big[a]:.1f}" for a in sorted(big)) + f"  {note}")
print(dict(tot))
