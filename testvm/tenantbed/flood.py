#!/usr/bin/python3
# A hostile tenant's floods from inside its guest, bounded in count and
# time, aimed only at addresses inside the node in a box. Arguments are
# key=value: seconds, dns (the resolver address), allowed and denied
# (name suffixes), dns_n, proxy (an address:port the guard redirects to
# the proxy), proxy_n, syn (comma-separated addresses, each with an
# optional :port; without one, ports cycle), syn_n, udp
# (comma-separated addresses), udp_n. Prints one line of counts as JSON.
import json
import os
import random
import resource
import select
import socket
import sys
import threading
import time

args = dict(a.split("=", 1) for a in sys.argv[1:])
deadline = time.monotonic() + float(args.get("seconds", "30"))
counts = {}
lock = threading.Lock()


def count(key, n=1):
    with lock:
        counts[key] = counts.get(key, 0) + n


start = time.monotonic()


def pace(sent, n):
    """Sleeps while sent is ahead of n spread evenly over the seconds."""
    if sent % 64:
        return
    ahead = sent * float(args.get("seconds", "30")) / n - (time.monotonic() - start)
    if ahead > 0:
        time.sleep(ahead)


def query(name):
    q = b"".join(bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\0"
    return os.urandom(2) + b"\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00" + q + b"\x00\x01\x00\x01"


def dns_flood():
    n = int(args.get("dns_n", "0"))
    if n == 0:
        return
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setblocking(False)
    sent = 0
    while sent < n and time.monotonic() < deadline:
        pace(sent, n)
        suffix = args["allowed"] if sent % 2 == 0 else args["denied"]
        try:
            s.sendto(query("f%x.%s" % (random.getrandbits(40), suffix)), (args["dns"], 53))
            sent += 1
        except BlockingIOError:
            select.select([s], [s], [], 0.01)
        except OSError:
            sent += 1
            count("dns_send_errors")
        try:
            while True:
                s.recv(4096)
                count("dns_answers")
        except OSError:
            pass
    count("dns_sent", sent)
    s.close()


def proxy_flood():
    n = int(args.get("proxy_n", "0"))
    if n == 0:
        return
    host, port = args["proxy"].rsplit(":", 1)
    held = []
    # the internet host's address is learned once the DNS flood's first
    # allowed name is answered
    while counts.get("dns_answers", 0) == 0 and time.monotonic() < start + 5:
        time.sleep(0.05)
    for i in range(n):
        if time.monotonic() >= deadline:
            break
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.settimeout(2)
        try:
            s.connect((host, int(port)))
            # headers never finished: the proxy waits for the Host line
            s.send(b"GET / HTTP/1.1\r\nUser-Agent: tenant-a\r\n")
            held.append(s)
            count("proxy_held")
        except OSError:
            s.close()
            count("proxy_refused")
    while time.monotonic() < deadline:
        time.sleep(0.2)
    for s in held:
        s.close()


def syn_flood():
    n = int(args.get("syn_n", "0"))
    targets = [t for t in args.get("syn", "").split(",") if t]
    if n == 0 or not targets:
        return
    sent = 0
    while sent < n and time.monotonic() < deadline:
        pace(sent, n)
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setblocking(False)
        host, _, port = targets[sent % len(targets)].partition(":")
        try:
            s.connect_ex((host, int(port) if port else 1 + (sent * 7919) % 65000))
        except OSError:
            count("syn_errors")
        s.close()
        sent += 1
    count("syn_sent", sent)


def udp_flood():
    n = int(args.get("udp_n", "0"))
    targets = [t for t in args.get("udp", "").split(",") if t]
    if n == 0 or not targets:
        return
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setblocking(False)
    sent = 0
    payload = b"x" * 64
    while sent < n and time.monotonic() < deadline:
        pace(sent, n)
        try:
            s.sendto(payload, (targets[sent % len(targets)], 1024 + (sent * 104729) % 60000))
        except OSError:
            count("udp_errors")
            select.select([], [s], [], 0.01)
        sent += 1
    count("udp_sent", sent)
    s.close()


def main():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    ts = [threading.Thread(target=f) for f in (dns_flood, proxy_flood, syn_flood, udp_flood)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    print(json.dumps(counts, sort_keys=True))


main()
