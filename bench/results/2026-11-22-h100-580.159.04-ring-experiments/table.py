import re,collections,sys
rows=collections.defaultdict(list)
p=v=None
for line in open(sys.argv[1]):
    m=re.match(r'== pass (\d) variant ([^: ]+)',line)
    if m: p,v=m.groups(); continue
    m=re.match(r'(\d+ [MG]iB)\s+(htod|dtoh)\s+(cached|streaming)\s+\|\s+([\d.]+)',line)
    if m: rows[(v,m.group(1)+' '+m.group(2)+' '+m.group(3)[:4])].append(m.group(4)); continue
    m=re.match(r'(\d+ [MG]iB)\s+(htod|dtoh)\s+\| back to back\s+([\d.]+) GB/s \| after idle\s+([\d.]+)',line)
    if m: rows[(v,m.group(1)+' '+m.group(2)+' b2b')].append(m.group(3)); rows[(v,m.group(1)+' '+m.group(2)+' idle')].append(m.group(4))
keys=sorted(set(k for _,k in rows), key=lambda k:(k.split()[2], int(k.split()[0])*(1024 if k.split()[1]=='GiB' else 1), k))
vs=sorted(set(v for v,_ in rows))
print('%-22s'%'row'+''.join('%-20s'%v for v in vs))
for k in keys:
    print('%-22s'%k+''.join('%-20s'%'/'.join(rows[(v,k)]) for v in vs))
