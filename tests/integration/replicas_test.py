"""Replicas sharing a real redis-server (the remote KV tier), end to end on the default model.

Starts redis-server, two `strata serve` replicas whose KV stores share it, and a cache-less server
(no store, no prefix cache) whose greedy answers are the reference. Then:
  - a conversation started on replica A resumes on replica B with its history's KV loaded from
    Redis (usage: cached tokens, tier `remote`) and the cache-less server's greedy answer, sent
    as messages (OpenAI style) or as a gRPC session, whose history Redis shares too;
  - Redis stopped mid-run, and a corrupt value in it: requests still succeed, recomputing, with
    the reference answers; metrics say why;
  - the deployment recipe of docs/deployment.md: the two replicas behind nginx (Debian's) with
    consistent hashing on the X-Session-Id header; a session's turns land on one replica, and
    when that replica dies its next turn goes to the other and loads the history from Redis.

usage: replicas_test.py --binary build/bin/strata --model MODEL.gguf --proto-dir proto
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request

import grpc

from harness import Redis, check, free_port, skip, summary

GREEDY_TOKENS = 24
HISTORY = "You are a helpful assistant. Answer in one short sentence. " * 6


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--binary", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--proto-dir", required=True)
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="strata-replicas-")
    subprocess.run(["protoc", f"--proto_path={args.proto_dir}", f"--python_out={work}",
                    os.path.join(args.proto_dir, "strata/v1/generation.proto")], check=True)
    sys.path.insert(0, work)
    from strata.v1 import generation_pb2 as pb  # noqa: E402

    processes = []

    class Server:
        """A `strata serve` process: its gRPC channel, HTTP port and metrics."""

        def __init__(self, name, *overrides):
            self.name = name
            self.grpc_port, self.http_port = free_port(), free_port()
            config = os.path.join(work, f"{name}.yaml")
            with open(config, "w") as f:
                f.write(f"model:\n  path: {args.model}\nserver:\n  grpc_port: {self.grpc_port}\n"
                        f"  http_port: {self.http_port}\n")
            command = [args.binary, "serve", "--config", config]
            for o in overrides:
                command += ["--set", o]
            self.process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
            processes.append(self.process)
            lines = [self.process.stdout.readline(), self.process.stdout.readline()]
            assert lines[0].startswith("grpc_port="), (name, lines)
            channel = grpc.insecure_channel(f"127.0.0.1:{self.grpc_port}")
            grpc.channel_ready_future(channel).result(timeout=60)
            self.chat_call = channel.unary_stream(
                "/strata.v1.Generation/Chat", request_serializer=pb.ChatRequest.SerializeToString,
                response_deserializer=pb.GenerateResponse.FromString)

        def greedy(self, request):
            """Runs a ChatRequest greedily: (text, usage, [(token id, top-2 logprob gap)])."""
            request.sampling.CopyFrom(pb.SamplingParams(temperature=0, max_tokens=GREEDY_TOKENS,
                                                        logprobs=2))
            text, last, tokens = "", None, []
            for r in self.chat_call(request, timeout=300):
                text += r.text
                tokens += [(lp.token_id, lp.top[0].logprob - lp.top[1].logprob)
                           for lp in r.logprobs]
                last = r
            return text, last.usage, tokens

        def chat(self, messages):
            """A stateless chat over gRPC (the history sent as messages)."""
            request = pb.ChatRequest()
            for role, content in messages:
                request.messages.add(role=role, content=content)
            return self.greedy(request)

        def session_chat(self, session, content):
            """A turn of a server-side session (gRPC ChatRequest.session_id)."""
            return self.greedy(pb.ChatRequest(
                session_id=session, message=pb.ChatMessage(role="user", content=content)))

        def http_chat(self, messages, session="", port=None):
            """Greedy chat over HTTP (to `port`: a proxy), (text, usage, [(token, top-2 gap)])."""
            body = json.dumps({"messages": [{"role": r, "content": c} for r, c in messages],
                               "max_tokens": GREEDY_TOKENS, "temperature": 0, "logprobs": True,
                               "top_logprobs": 2}).encode()
            request = urllib.request.Request(
                f"http://127.0.0.1:{port or self.http_port}/v1/chat/completions", data=body,
                headers={"Content-Type": "application/json", "X-Session-Id": session})
            with urllib.request.urlopen(request, timeout=300) as response:
                reply = json.loads(response.read())
            choice = reply["choices"][0]
            tokens = [(t["token"], t["top_logprobs"][0]["logprob"] - t["top_logprobs"][1]["logprob"])
                      for t in choice["logprobs"]["content"]]
            return choice["message"]["content"], reply["usage"], tokens

        def lookup(self, messages):
            """POST /v1/kv/lookup: (stored tokens, tier) this replica holds for the chat."""
            body = json.dumps({"messages": [{"role": r, "content": c} for r, c in messages]})
            request = urllib.request.Request(
                f"http://127.0.0.1:{self.http_port}/v1/kv/lookup", data=body.encode(),
                headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=60) as response:
                reply = json.loads(response.read())
            assert reply["object"] == "kv.lookup" and reply["prompt_tokens"] > 0, reply
            return reply["stored_tokens"], reply["tier"]

        def metrics(self):
            text = urllib.request.urlopen(f"http://127.0.0.1:{self.http_port}/metrics",
                                          timeout=30).read().decode()
            samples = {}
            for line in text.splitlines():
                if line and not line.startswith("#"):
                    key, value = line.rsplit(" ", 1)
                    samples[key] = float(value)
            return samples

        def metric(self, key):
            return self.metrics().get(key, 0.0)

        def wait_written_through(self, chunks_before):
            """Waits until the remote tier holds more chunks than before and has stopped
            growing for 1.5 s (write-through is asynchronous and chunk by chunk: a turn ends
            before its KV reaches Redis, and the metrics refresh about once a second). A replica
            that reads a partly written item finds fewer chunks than its own prefix cache may
            hold, and does not count it as found."""
            deadline = time.time() + 30
            last, since = None, time.time()
            while time.time() < deadline:
                now = self.metric('strata_kv_store_chunks{tier="remote"}')
                if now != last:
                    last, since = now, time.time()
                elif now > chunks_before and time.time() - since >= 1.5:
                    return
                time.sleep(0.05)
            raise AssertionError(f"{self.name}: the remote tier did not settle above "
                                 f"{chunks_before} chunks (last {last})")

        def wait_metric(self, key, want, timeout=15):
            """The metric once it equals `want` (it may lag a response by a stats refresh), or
            its value at the timeout."""
            deadline = time.time() + timeout
            while True:
                value = self.metric(key)
                if value == want or time.time() > deadline:
                    return value
                time.sleep(0.1)

        def stop(self):
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait()

    redis = Redis()
    replica = ["kv_store.dram_bytes=256MiB", f"kv_store.remote_address=127.0.0.1:{redis.port}",
               "kv_store.remote_retry_ms=300", "kv_store.remote_timeout_ms=500",
               "scheduler.max_num_seqs=8", "model.weights=dequantize"]
    a = Server("a", *replica)
    b = Server("b", *replica)
    reference = Server("reference", "kv_store.dram_bytes=0", "kv_cache.enable_prefix_caching=false",
                       "scheduler.max_num_seqs=8", "model.weights=dequantize")

    def same_greedy_tokens(got, expected):
        """The reference's greedy tokens, except that loading stored KV (a few ulps from
        recomputing it) may flip a near-tie, and only there: compares up to the first
        difference, which the reference must have scored within 1e-3 of its runner-up."""
        for (token, _), (want, gap) in zip(got, expected):
            if token != want:
                assert gap < 1e-3, f"token {token!r} vs {want!r}, top-2 gap {gap}"
                return
        assert len(got) == len(expected)

    def conversation(topic):
        return [("system", HISTORY), ("user", f"Tell me one fact about {topic}.")]

    def follow_up(messages, reply, question="And another one?"):
        return messages + [("assistant", reply), ("user", question)]

    def test_conversation_resumes_on_the_other_replica():
        first = conversation("the Moon")
        before = a.metric('strata_kv_store_chunks{tier="remote"}')
        reply, _, _ = a.chat(first)
        a.wait_written_through(before)
        second = follow_up(first, reply)
        # What each replica reports holding, for a router: A has it, B has not seen it.
        stored, tier = a.lookup(second)
        assert stored >= 64 and tier == "dram", (stored, tier)
        assert b.lookup(second) == (0, None)
        _, usage, tokens = b.chat(second)
        assert usage.cached_tier == "remote", usage
        assert b.lookup(second)[0] >= stored
        assert usage.cached_prompt_tokens >= 64, usage
        same_greedy_tokens(tokens, reference.chat(second)[2])
        assert b.metric("strata_kv_store_shared_found_total") >= 1
        assert b.metric('strata_kv_store_hits_total{tier="remote"}') >= 1

    def test_grpc_session_continues_on_the_other_replica():
        # The session's history is shared through Redis as well as its KV.
        opening = HISTORY + "Tell me one fact about owls."
        before = a.metric('strata_kv_store_chunks{tier="remote"}')
        reply, first, _ = a.session_chat("owls", opening)
        a.wait_written_through(before)
        _, usage, tokens = b.session_chat("owls", "And another one?")
        assert usage.prompt_tokens > first.prompt_tokens + 10, (usage, first)
        assert usage.cached_tier == "remote" and usage.cached_prompt_tokens >= 64, usage
        same_greedy_tokens(tokens, reference.chat(
            [("user", opening), ("assistant", reply), ("user", "And another one?")])[2])

    def test_redis_down_mid_run_recomputes():
        first = conversation("rivers")
        before = a.metric('strata_kv_store_chunks{tier="remote"}')
        reply, _, _ = a.chat(first)
        a.wait_written_through(before)
        redis.stop()
        try:
            second = follow_up(first, reply)
            start = time.time()
            _, usage, tokens = b.chat(second)
            assert time.time() - start < 60, "bounded"
            assert usage.cached_tier != "remote", usage
            same_greedy_tokens(tokens, reference.chat(second)[2])
            failures = b.metrics()
            assert failures.get('strata_kv_store_tier_failures_total{tier="remote",'
                                'reason="unreachable"}', 0) >= 1, failures
            assert failures['strata_kv_store_tier_available{tier="remote"}'] == 0, failures
            # A new conversation on A goes on too, its write-through refused.
            _, _, tokens = a.chat(conversation("mountains"))
            same_greedy_tokens(tokens, reference.chat(conversation("mountains"))[2])
        finally:
            redis.start()  # empty, as after a crash
        time.sleep(0.5)  # past remote_retry_ms
        third = conversation("volcanoes")
        before = a.metric('strata_kv_store_chunks{tier="remote"}')
        reply, _, _ = a.chat(third)
        a.wait_written_through(before)
        _, usage, _ = b.chat(follow_up(third, reply))
        assert usage.cached_tier == "remote", usage

    def test_corrupt_value_is_recomputed_not_served():
        first = conversation("glaciers")
        before = a.metric('strata_kv_store_chunks{tier="remote"}')
        reply, _, _ = a.chat(first)
        a.wait_written_through(before)
        keys = redis.cli("KEYS", "strata:*:k:*").split()
        assert keys, "no chunk keys in redis"
        for key in keys:  # one byte of every chunk's payload
            redis.cli("SETRANGE", key, "4000", "X")
        corrupt_before = b.metric("strata_kv_store_corrupt_chunks_total")
        second = follow_up(first, reply)
        _, usage, tokens = b.chat(second)
        assert usage.cached_tier != "remote", usage
        same_greedy_tokens(tokens, reference.chat(second)[2])
        assert b.metric("strata_kv_store_corrupt_chunks_total") > corrupt_before

    def test_nginx_consistent_hashing_and_failover():
        nginx = shutil.which("nginx") or "/usr/sbin/nginx"
        if not os.path.exists(nginx):
            skip("nginx_consistent_hashing_and_failover", "nginx is not installed")
            return
        port = free_port()
        prefix = os.path.join(work, "nginx")
        os.makedirs(os.path.join(prefix, "logs"), exist_ok=True)
        with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                               "configs", "nginx-replicas.conf")) as f:
            conf = f.read()
        conf = conf.replace("listen 8080;", f"listen 127.0.0.1:{port};")
        conf = conf.replace("listen 9090 http2;", f"listen 127.0.0.1:{free_port()} http2;")
        for old, new in (("8001", a.http_port), ("8002", b.http_port), ("9001", a.grpc_port),
                         ("9002", b.grpc_port)):
            conf = conf.replace(f"server 127.0.0.1:{old}", f"server 127.0.0.1:{new}")
        if os.geteuid() == 0:  # workers as nobody could not enter the test's private directory
            conf = "user root;\n" + conf
        conf_path = os.path.join(prefix, "nginx.conf")
        with open(conf_path, "w") as f:
            f.write(conf)
        proxy = subprocess.Popen([nginx, "-p", prefix, "-c", conf_path, "-g",
                                  f"daemon off; pid {prefix}/nginx.pid; error_log {prefix}/logs/error.log;"])
        processes.append(proxy)
        try:
            for attempt in range(200):
                try:
                    urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5)
                    break
                except OSError:
                    assert proxy.poll() is None and attempt < 199, "nginx did not start"
                    time.sleep(0.05)

            def http_chat(session, messages):
                text, usage, _ = a.http_chat(messages, session, port)
                return text, usage

            def served(server):
                return server.metric(
                    'strata_http_requests_total{endpoint="/v1/chat/completions",status="200"}')

            # Each session sticks to one replica.
            for session in ("alice", "bob", "carol", "dave"):
                counts = (served(a), served(b))
                messages = conversation(f"{session}'s garden")
                reply, _ = http_chat(session, messages)
                first = (served(a) - counts[0], served(b) - counts[1])
                assert sorted(first) == [0, 1], first
                http_chat(session, follow_up(messages, reply))
                second = (served(a) - counts[0], served(b) - counts[1])
                assert second == (2 * first[0], 2 * first[1]), (session, first, second)

            # The replica of a session dies: its next turn goes to the other one, which loads
            # the history from Redis.
            messages = conversation("the sea")
            counts = (served(a), served(b))
            remote = 'strata_kv_store_chunks{tier="remote"}'
            written = {a.name: a.metric(remote), b.name: b.metric(remote)}
            reply, _ = http_chat("erin", messages)
            home, other = (a, b) if served(a) > counts[0] else (b, a)
            home.wait_written_through(written[home.name])
            home.stop()
            found = other.metric("strata_kv_store_shared_found_total")
            second = follow_up(messages, reply)
            _, usage, tokens = a.http_chat(second, "erin", port)
            assert usage["prompt_tokens_details"]["cached_tokens"] >= 64, usage
            now_found = other.wait_metric("strata_kv_store_shared_found_total", found + 1)
            assert now_found == found + 1, (other.name, found, now_found)
            same_greedy_tokens(tokens, reference.http_chat(second)[2])
        finally:
            proxy.terminate()
            proxy.wait()

    try:
        check("conversation_resumes_on_the_other_replica",
              test_conversation_resumes_on_the_other_replica)
        check("grpc_session_continues_on_the_other_replica",
              test_grpc_session_continues_on_the_other_replica)
        check("redis_down_mid_run_recomputes", test_redis_down_mid_run_recomputes)
        check("corrupt_value_is_recomputed_not_served", test_corrupt_value_is_recomputed_not_served)
        check("nginx_consistent_hashing_and_failover", test_nginx_consistent_hashing_and_failover)
    finally:
        for p in processes:
            if p.poll() is None:
                p.kill()
                p.wait()
        shutil.rmtree(work, ignore_errors=True)
    return summary()


if __name__ == "__main__":
    sys.exit(main())
