"""How long a message takes across an emulated link (cluster.sh): the sender sends SIZE bytes,
the receiver answers one byte when all have arrived; after a PAUSE (the token bucket refills)
the next. Prints the median and, with --rate, the time SIZE takes at that rate and the ratio of
the two (1.0: the link held its rate; below 1: part of the message went through faster). Every
wait ends after --timeout-s with an error that says what did not arrive.

    ip netns exec NAME-h1 python3 bench/netns/pingpong.py recv 10.211.0.1 &
    ip netns exec NAME-h2 python3 bench/netns/pingpong.py send 10.211.0.1 --size 320000 --pause 0.005 --rate 1gbit

The receiver serves one sender, then exits. tests/multiproc/netns_test.sh checks with it that a
short message after a pause crosses no faster than the link's rate.
"""
import argparse
import re
import socket
import sys
import time


def bits_per_s(rate):
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([kmg]?)bit", rate.lower())
    if not m:
        raise SystemExit("pingpong.py: --rate takes a rate like 100mbit, 1gbit or 10gbit, not %r" % rate)
    return float(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)]


def receive(address, port, timeout_s):
    server = socket.create_server((address, port))
    server.settimeout(timeout_s)
    try:
        peer, _ = server.accept()
    except socket.timeout:
        raise SystemExit("pingpong.py recv: no sender connected to %s:%d within %g s" % (address, port, timeout_s))
    peer.settimeout(timeout_s)
    peer.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    buffer = memoryview(bytearray(1 << 20))
    while True:
        header = peer.recv(8, socket.MSG_WAITALL)
        if len(header) < 8:
            return
        left = int.from_bytes(header, "little")
        while left:
            got = peer.recv_into(buffer[:min(len(buffer), left)])
            if not got:
                return
            left -= got
        peer.sendall(b"k")


def send(address, port, size, count, pause, timeout_s):
    deadline = time.monotonic() + timeout_s
    while True:  # the receiver may still be starting
        try:
            peer = socket.create_connection((address, port), timeout=timeout_s)
            break
        except OSError as error:
            if time.monotonic() > deadline:
                raise SystemExit("pingpong.py send: cannot connect to the receiver at %s:%d within %g s (%s); "
                                 "start `pingpong.py recv` there first" % (address, port, timeout_s, error))
            time.sleep(0.1)
    peer.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    message, times = size.to_bytes(8, "little") + b"x" * size, []
    for _ in range(count):
        time.sleep(pause)
        start = time.perf_counter()
        peer.sendall(message)
        if peer.recv(1) != b"k":
            raise SystemExit("pingpong.py: the receiver went away")
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("role", choices=("send", "recv"))
    p.add_argument("address", help="the receiver's address")
    p.add_argument("--port", type=int, default=5601)
    p.add_argument("--size", type=int, default=320000, help="bytes per message")
    p.add_argument("--count", type=int, default=21, help="messages (the median is printed)")
    p.add_argument("--pause", type=float, default=0.005, help="seconds before each message")
    p.add_argument("--rate", default=None, help="the link's rate: also print the time the size takes at it, and the ratio")
    p.add_argument("--timeout-s", type=float, default=30.0, help="the longest any wait (connect, accept, a reply) may take")
    args = p.parse_args()
    try:
        if args.role == "recv":
            receive(args.address, args.port, args.timeout_s)
            return
        median = send(args.address, args.port, args.size, args.count, args.pause, args.timeout_s)
    except socket.timeout:
        raise SystemExit("pingpong.py %s: the other end sent nothing for %g s" % (args.role, args.timeout_s))
    line = "size=%d pause_ms=%g median_ms=%.3f" % (args.size, 1e3 * args.pause, 1e3 * median)
    if args.rate:
        at_rate = args.size * 8 / bits_per_s(args.rate)
        line += " at_rate_ms=%.3f ratio=%.2f" % (1e3 * at_rate, median / at_rate)
    print(line)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
