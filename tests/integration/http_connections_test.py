#!/usr/bin/env python3
"""Slow, idle, abusive and unusual HTTP clients against `strata serve` (the connection gate).

Against one real server on loopback with the default model: 200 connections sending their request
one byte a second plus 50 idle ones must not delay /health or a completion by more than 1 s, and
are answered 408 / closed once the header timeout passes; past server.max_connections a new
connection is answered 503 while existing ones keep working; Expect: 100-continue, pipelined
requests, chunked bodies and oversized headers get what HTTP/1.1 says.

usage: http_connections_test.py --binary build/bin/strata --model MODEL.gguf
Prints "N passed, N failed" and exits non-zero on any failure.
"""
import argparse
import json
import socket
import sys
import threading
import time
import weakref

from harness import check, summary
from http_server_test import FRANCE_IDS, Server

MAX_CONNECTIONS = 300
HEADER_TIMEOUT_S = 10  # HttpServerOptions::header_timeout's default


_unread = weakref.WeakKeyDictionary()  # socket -> bytes received past the last response read


def read_response(sock, timeout=30.0):
    """One HTTP/1.1 response from `sock`: (status, headers dict, body bytes); status 0 on EOF.
    Bytes of the responses after it (pipelining) are kept for the next call on the socket."""
    sock.settimeout(timeout)
    data = _unread.pop(sock, b"")
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return 0, {}, data
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    lines = head.decode().split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.strip().lower(): v.strip() for k, v in (l.split(":", 1) for l in lines[1:])}
    if "content-length" not in headers:
        return status, headers, body
    length = int(headers["content-length"])
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    if len(body) > length:
        _unread[sock] = body[length:]
    return status, headers, body[:length]


def completion_body(max_tokens=4):
    return json.dumps({"prompt": FRANCE_IDS, "max_tokens": max_tokens, "temperature": 0}).encode()


def post(path, body, extra_headers=b""):
    return (b"POST " + path + b" HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" +
            extra_headers + b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--binary", required=True)
    parser.add_argument("--model", required=True)
    args = parser.parse_args()
    server = Server(args.binary, args.model,
                    ["--set", f"server.max_connections={MAX_CONNECTIONS}"])

    def connect():
        return socket.create_connection(("127.0.0.1", server.port), timeout=30)

    def timed_requests():
        """Seconds for GET /health and for a 4-token completion, each on a fresh connection."""
        times = []
        for request in (b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n",
                        post(b"/v1/completions", completion_body())):
            start = time.monotonic()
            with connect() as s:
                s.sendall(request)
                status, _, body = read_response(s)
            assert status == 200, (status, body[:200])
            times.append(time.monotonic() - start)
        return times

    def test_slow_and_idle_clients_do_not_delay_requests():
        baseline = [min(t) for t in zip(*(timed_requests() for _ in range(3)))]
        request = post(b"/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi"}]}')
        slow = [connect() for _ in range(200)]
        idle = [connect() for _ in range(50)]
        start = time.monotonic()
        stop = threading.Event()

        def drip():  # one byte a second on every slow connection
            for i in range(len(request)):
                for s in slow:
                    try:
                        s.send(request[i:i + 1])
                    except OSError:
                        pass
                if stop.wait(1.0):
                    return

        dripper = threading.Thread(target=drip)
        dripper.start()
        try:
            time.sleep(2)
            loaded = [max(t) for t in zip(*(timed_requests() for _ in range(3)))]
            for name, before, after in zip(("health", "completion"), baseline, loaded):
                assert after - before <= 1.0, f"{name}: {before:.3f}s alone, {after:.3f}s under load"
            # Past the header timeout every slow connection is answered 408 and closed, every
            # idle one closed.
            time.sleep(max(0.0, start + HEADER_TIMEOUT_S + 2 - time.monotonic()))
            stop.set()
            dripper.join()
            for s in slow:
                status, _, body = read_response(s, timeout=10)
                assert status == 408 and json.loads(body)["error"]["message"], (status, body)
            for s in idle:
                s.settimeout(10)
                assert s.recv(1) == b""
        finally:
            stop.set()
            dripper.join()
            for s in slow + idle:
                s.close()

    def test_connection_limit():
        # Opened at once: the server closes connections that send nothing within 10 s.
        held = [connect() for _ in range(MAX_CONNECTIONS + 10)]
        try:
            refused = []
            for _ in range(16):  # up to 8 s for the server to accept them all
                time.sleep(0.5)
                refused = []
                for s in held:
                    s.setblocking(False)
                    try:
                        if s.recv(1, socket.MSG_PEEK):
                            refused.append(s)
                    except BlockingIOError:
                        pass
                    s.setblocking(True)
                if len(refused) >= 10:
                    break
            # A few of the test's own connections may still be closing on the server.
            assert 10 <= len(refused) <= 12, len(refused)
            status, headers, body = read_response(refused[0])
            assert status == 503 and headers["connection"] == "close", (status, headers)
            assert "too many open connections" in json.loads(body)["error"]["message"]
            # The connections already open still work.
            held[0].sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            assert read_response(held[0])[0] == 200
        finally:
            for s in held:
                s.close()
        time.sleep(0.5)
        timed_requests()

    def test_expect_100_continue():
        body = completion_body()
        with connect() as s:
            s.sendall(post(b"/v1/completions", b"", b"Expect: 100-continue\r\n")
                      .replace(b"Content-Length: 0", b"Content-Length: " + str(len(body)).encode()))
            status, _, _ = read_response(s)
            assert status == 100, status
            s.sendall(body)
            status, _, reply = read_response(s)
            assert status == 200, (status, reply[:200])
            assert json.loads(reply)["choices"][0]["text"].startswith(" Paris"), reply
        # An oversized body is refused before it is sent.
        with connect() as s:
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
                      b"Content-Length: 999999999\r\n\r\n")
            status, _, reply = read_response(s)
            assert status == 413, (status, reply)

    def test_pipelined_requests():
        with connect() as s:
            s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n" +
                      post(b"/v1/completions", completion_body()) +
                      b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
            first, second, third = (read_response(s) for _ in range(3))
            assert first[0] == 200 and second[0] == 200 and third[0] == 200
            assert json.loads(second[2])["choices"][0]["text"].startswith(" Paris")
            assert json.loads(third[2])["data"][0]["id"], third

    def test_chunked_body():
        body = completion_body()
        chunks = b"".join(b"%x\r\n%s\r\n" % (len(body[i:i + 7]), body[i:i + 7])
                          for i in range(0, len(body), 7))
        with connect() as s:
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                      b"\r\nTransfer-Encoding: chunked\r\n\r\n" + chunks + b"0\r\n\r\n")
            status, _, reply = read_response(s)
            assert status == 200, (status, reply[:300])
            assert json.loads(reply)["choices"][0]["text"].startswith(" Paris")

    def test_malformed_framing():
        cases = [
            (b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 20000 + b"\r\n\r\n", 431),
            (b"POST /v1/completions HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n", 400),
            (b"POST /v1/completions HTTP/1.1\r\nContent-Length: 5\r\n"
             b"Transfer-Encoding: chunked\r\n\r\n", 400),
            (b"POST /v1/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", 400),
            (b"POST /v1/completions HTTP/1.1\r\nContent-Length: -1\r\n\r\n", 400),
            (b"GET /health HTTP/1.1\r\nno colon here\r\n\r\n", 400),
        ]
        for request, expected in cases:
            with connect() as s:
                s.sendall(request)
                status, headers, body = read_response(s)
                assert status == expected, (request[:60], status, body)
                assert json.loads(body)["error"]["message"], body
        timed_requests()

    try:
        check("slow and idle clients do not delay requests",
              test_slow_and_idle_clients_do_not_delay_requests)
        check("connection limit", test_connection_limit)
        check("Expect: 100-continue", test_expect_100_continue)
        check("pipelined requests", test_pipelined_requests)
        check("chunked body", test_chunked_body)
        check("malformed framing", test_malformed_framing)
    finally:
        server.stop()
    return summary()


if __name__ == "__main__":
    sys.exit(main())
