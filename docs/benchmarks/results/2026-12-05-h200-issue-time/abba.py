import json, sys, statistics as st
runs = {n: json.load(open(f'/tmp/dev2/res/{n}/bench.json'))['rows'] for n in ['bench_1_old','bench_2_new','bench_3_new','bench_4_old']}
runs['bench_0_new'] = json.load(open('/tmp/dev1/res/bench_1_new/bench.json'))['rows']
key = lambda r: (r['tokens'], r['direction'], r['placement'], r['io'], 'yes' if r['cuda_graph_cache'] else ('-' if r['io']=='direct' else 'no'), r['chunk_pages'])
tab = {}
for n, rows in runs.items():
    for r in rows: tab.setdefault(key(r), {})[n] = r
print('| tokens (pages) | direction | placement | io | graphs | chunk | d61fd63 issue ms | 5112da9 issue ms | new / old | x floor (new) | copy calls old / new | bit-exact |')
print('| --- | --- | --- | --- | --- | --- | ---: | ---: | ---: | ---: | --- | --- |')
for k, v in tab.items():
    old = st.mean(v[n]['issue_ms'] for n in ['bench_1_old','bench_4_old'])
    new = st.mean(v[n]['issue_ms'] for n in ['bench_2_new','bench_3_new'])
    xf = st.mean(v[n]['x_floor'] for n in ['bench_2_new','bench_3_new'])
    ops = lambda n: '+'.join(f'{c} {o}' for d in v[n].get('ops', [{'?':''}])[:1] for o,c in d.items())
    be = all(r['bit_exact'] and r['reference_bit_exact'] for r in v.values())
    t,dr,pl,io,g,ch = k
    print(f'| {t} ({t//64}) | {dr} | {pl} | {io} | {g} | {ch} | {old:.2f} | {new:.2f} | {new/old:.2f} | {xf:.3f} | {ops("bench_1_old")} / {ops("bench_2_new")} | {"yes" if be else "NO"} |')
print('single-call new (call 1) issue at 16K:', [round(v['bench_0_new']['issue_ms'],2) for k,v in tab.items() if k[0]==16384])
