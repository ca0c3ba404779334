-- wrk script for bench/ingress.py: POST one signed GitHub delivery per request.
--
-- The body is signed once by service/ingress.py; every request still carries its own
-- X-GitHub-Delivery ("<run>-t<thread>-<n>"), so ids never repeat across threads or runs and
-- looprelay queues every request instead of answering "duplicate".
--
-- Environment: WEBHOOK_BODY_FILE (payload path), WEBHOOK_SIGNATURE ("sha256=<hex>"),
-- WEBHOOK_EVENT (X-GitHub-Event), WEBHOOK_RUN_ID (unique per wrk run) and
-- WEBHOOK_EXPECT_STATUS (the one status this receiver acks with, e.g. 202).
--
-- done() prints one parseable line; "unexpected" counts responses with any other status:
--   RESULT requests=N duration_us=N p50_us=N p95_us=N p99_us=N unexpected=N first_bad=N
--          connect=N read=N write=N timeout=N

local threads = {}
local next_thread = 1

local function required(name)
  local value = os.getenv(name)
  if value == nil or value == "" then
    error(name .. " is not set; run this script through bench/ingress.py")
  end
  return value
end

function setup(thread)
  thread:set("thread_id", next_thread)
  table.insert(threads, thread)
  next_thread = next_thread + 1
end

function init(args)
  local file = assert(io.open(required("WEBHOOK_BODY_FILE"), "rb"))
  payload = file:read("*a")
  file:close()
  prefix = required("WEBHOOK_RUN_ID") .. "-t" .. thread_id .. "-"
  request_headers = {
    ["Content-Type"] = "application/json",
    ["X-GitHub-Event"] = required("WEBHOOK_EVENT"),
    ["X-Hub-Signature-256"] = required("WEBHOOK_SIGNATURE"),
  }
  expect_status = tonumber(required("WEBHOOK_EXPECT_STATUS"))
  if expect_status == nil then
    error("WEBHOOK_EXPECT_STATUS must be a number such as 202")
  end
  sent = 0
  unexpected = 0
  first_bad = 0
end

function request()
  sent = sent + 1
  request_headers["X-GitHub-Delivery"] = prefix .. sent
  return wrk.format("POST", nil, request_headers, payload)
end

-- Defining response() makes wrk parse every response; the cost is wrk's, on the client side,
-- and it is the only way to check for exactly the expected status rather than "not 4xx/5xx".
function response(status, headers, body)
  if status ~= expect_status then
    unexpected = unexpected + 1
    if first_bad == 0 then
      first_bad = status
    end
  end
end

function done(summary, latency, requests)
  local bad, first = 0, 0
  for _, thread in ipairs(threads) do
    bad = bad + thread:get("unexpected")
    if first == 0 then
      first = thread:get("first_bad")
    end
  end
  local errors = summary.errors
  io.write(string.format(
    "RESULT requests=%d duration_us=%d p50_us=%.0f p95_us=%.0f p99_us=%.0f unexpected=%d"
      .. " first_bad=%d connect=%d read=%d write=%d timeout=%d\n",
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(95),
    latency:percentile(99), bad, first, errors.connect, errors.read, errors.write,
    errors.timeout))
end
