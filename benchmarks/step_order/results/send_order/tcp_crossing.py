"""Raw TCP between the emulated hosts (no MPI, no ringlet, no CPU quota): each of 4 hosts sends 64 MiB and
receives 64 MiB, either around a ring (two connections) or crossing with one partner over one
connection (pair) or two (pair2). Run from the repository root with the cluster up:

    for mode in ring pair pair2; do for r in 0 1 2 3; do
      ip netns exec rgl-h$r python3 benchmarks/results/step_order_s18/tcp_crossing.py $mode $r 67108864 & done; wait; done
"""
import socket, sys, threading, time
mode, rank, nbytes = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
ip = lambda r: f"10.213.0.{r+1}"
PORT = 29700
CH = 1 << 20
def listen(port):
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((ip(rank), port)); s.listen(4); return s
def connect(r, port):
    for _ in range(200):
        try:
            c = socket.create_connection((ip(r), port)); return c
        except OSError: time.sleep(0.05)
    raise SystemExit("no connect")
def send(sock, n):
    buf = b"x" * CH
    while n > 0:
        k = sock.send(buf[:min(CH, n)]); n -= k
def recv(sock, n):
    buf = bytearray(CH)
    while n > 0:
        k = sock.recv_into(buf, min(CH, n)); n -= k
if mode == "pair":
    peer = rank ^ 1
    if rank < peer:
        l = listen(PORT); s, _ = l.accept()
    else:
        s = connect(peer, PORT)
    s.sendall(b"g"); s.recv(1)
    t0 = time.perf_counter()
    th = threading.Thread(target=send, args=(s, nbytes)); th.start(); recv(s, nbytes); th.join()
elif mode == "pair2":  # two sockets per pair, one per direction
    peer = rank ^ 1
    l = listen(PORT)
    out = connect(peer, PORT); inn, _ = l.accept()
    out.sendall(b"g"); inn.recv(1)
    t0 = time.perf_counter()
    th = threading.Thread(target=send, args=(out, nbytes)); th.start(); recv(inn, nbytes); th.join()
else:  # ring
    l = listen(PORT)
    out = connect((rank + 1) % 4, PORT); inn, _ = l.accept()
    out.sendall(b"g"); inn.recv(1)
    t0 = time.perf_counter()
    th = threading.Thread(target=send, args=(out, nbytes)); th.start(); recv(inn, nbytes); th.join()
dt = time.perf_counter() - t0
print(f"{mode} rank {rank}: {nbytes/dt/1e6:.1f} MB/s ({dt*1e3:.0f} ms)")
