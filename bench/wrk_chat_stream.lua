-- wrk script: a streamed chat completion request (the gateway overhead benchmark).
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer " .. (os.getenv("BENCH_API_KEY") or "sk-bench")
wrk.body = '{"model":"bench","messages":[{"role":"user","content":"Say hello"}],"max_tokens":2,"stream":true,"stream_options":{"include_usage":true}}'
