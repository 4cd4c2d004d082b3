"""Probe (not adopted): a processor price per byte per link class. The endpoints of inter-host transfers
count W times (integer weight), those of intra-host transfers once, and kappa is set to the intra shift
pattern's bound (beta_intra * sharing / load): the intra chains then run as measured, and inter
transfers cost the processors W times as much per byte. Re-predicts the measured 2 x 2 sweeps.
    python benchmarks/results/cost_model_s27/probes/class_kappa.py W [FILTER]     (W=0: the model as built)
"""
import sys, json, collections, os, dataclasses
import numpy as np
import ringlet.tuning.signature as sg
import ringlet.tuning.network as nw
from ringlet.tuning.cost import predict_allreduce
from ringlet.tuning.network import Topology, INTRA, INTER
from ringlet.tuning.profile import Profile
W = int(sys.argv[1]); filt = sys.argv[2] if len(sys.argv) > 2 else '2x2'
if W:
    def endpoints(self, src, dst):
        inter = (self._hosts[src] != self._hosts[dst]).astype(np.int64)
        w = 1 + (W - 1) * inter
        ends = np.bincount(src, weights=w, minlength=self.size) + np.bincount(dst, weights=w, minlength=self.size)
        ends = np.rint(ends).astype(np.int64)
        per_host = np.bincount(self._hosts, weights=ends, minlength=self.nhosts).astype(np.int64)
        hs, hd = self._hosts[src], self._hosts[dst]
        return np.stack([np.maximum(ends[src], ends[dst]), np.maximum(per_host[hs], per_host[hd]),
                         np.full(len(src), int(ends.sum()), np.int64)], axis=1)
    nw.Topology.endpoints = endpoints
    orig_add = sg._Resources.add
    def add(self, s, links, counts, src, dst, red):
        inter = self.hosts[src] != self.hosts[dst]
        rep = np.where(inter, W, 1)
        self._w = rep
        return orig_add(self, s, links, counts, src, dst, red)
    orig_proc = sg._Resources._processors
    def _processors(self, src, dst, counts):
        rep = self._w
        return orig_proc(self, np.repeat(src, rep), np.repeat(dst, rep), np.repeat(counts, rep))
    sg._Resources.add = add; sg._Resources._processors = _processors
R = 'benchmarks/results'
sets = []
for shape in ['2x2_1gbit', '2x2_10gbit', '4x1_10gbit', '4x1_1gbit']:
    for lab, d in [('a10', 'cost_model_s23/attempt10'), ('a11', 'cost_model_s24/attempt11'), ('a12', 'cost_model_s25/attempt12'), ('a13', 'cost_model_s27/attempt13')]:
        if os.path.exists(f'{R}/{d}/bench_{shape}.json'):
            sets.append((f'{lab} {shape}', f'{R}/{d}/profile_{shape}.json', [f'{R}/{d}/bench_small_{shape}.json', f'{R}/{d}/bench_{shape}.json']))
for d, shape in [('cost_model_s23/repeat_2x2_1gbit', '2x2_1gbit'), ('cost_model_s23/repeat_2x2_10gbit', '2x2_10gbit'),
                 ('cost_model_s24/repeat_2x2_1gbit', '2x2_1gbit')]:
    for run in 'AB':
        sets.append((f'{d.split("/")[0][-3:]} rep{run} {shape}', f'{R}/{d}/profile_{shape}.json', [f'{R}/{d}/bench_small_{run}_{shape}.json', f'{R}/{d}/bench_{run}_{shape}.json']))
tot = collections.Counter()
for label, prof, benches in sets:
    if filt not in label: continue
    p = Profile.load(prof); top = Topology(p.fingerprint.host_of()); net = p.network
    if W and net.cpus.scope == 'machine' and '2x2' in label:
        net = dataclasses.replace(net, kappa=net.links[INTRA].beta / 4)
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
    print(f"{label:22s} k={net.kappa*1e9:.2f} >=1MiB {nb}/7 <1MiB {ns}/7  " + ' '.join(f"{a[:4]}:{big[a]:.1f}" for a in sorted(big)))
print(dict(tot))
