// One open-loop ingest step: POST /jobs (a `noop` job) at a constant arrival rate; or, with
// VUS set, one closed-loop step: VUS virtual users each sending the next request as soon as
// the last was answered (k6's constant-vus executor), which measures throughput, not latency.
//
// The Python side (benchmark/ingest.py) runs this once per step and reads the JSON summary
// that handleSummary writes. Arrivals follow the schedule whatever the server does (k6's
// constant-arrival-rate executor); when every VU is busy, arrivals are dropped and counted
// as `dropped`, so a saturated server shows up as errors, never as a slower client.
//
// Environment: URL (the POST target), TOKEN (bearer, optional), RATE (requests/s),
// DURATION (seconds), PRE_VUS, MAX_VUS, SUMMARY (path of the JSON summary); VUS (closed loop:
// RATE, PRE_VUS and MAX_VUS are then unused).
import http from 'k6/http';

const rate = parseInt(__ENV.RATE || '100', 10);
const duration = parseInt(__ENV.DURATION || '10', 10);
const maxVUs = parseInt(__ENV.MAX_VUS || '200', 10);
const closedVUs = parseInt(__ENV.VUS || '0', 10);

const openLoop = {
  executor: 'constant-arrival-rate',
  rate: rate,
  timeUnit: '1s',
  duration: `${duration}s`,
  preAllocatedVUs: parseInt(__ENV.PRE_VUS || '20', 10),
  maxVUs: maxVUs,
  gracefulStop: '5s',
};
const closedLoop = {
  executor: 'constant-vus',
  vus: closedVUs,
  duration: `${duration}s`,
  gracefulStop: '5s',
};

export const options = {
  discardResponseBodies: true,
  summaryTrendStats: ['min', 'p(50)', 'p(95)', 'p(99)', 'max', 'count'],
  scenarios: { step: closedVUs > 0 ? closedLoop : openLoop },
};

http.setResponseCallback(http.expectedStatuses(202));

const headers = { 'Content-Type': 'application/json' };
if (__ENV.TOKEN) {
  headers.Authorization = `Bearer ${__ENV.TOKEN}`;
}
const params = { headers: headers, timeout: '10s', tags: { name: 'POST /jobs' } };

let sent = 0;

export default function () {
  sent += 1;
  const body = JSON.stringify({ taskType: 'noop', payload: { vu: __VU, n: sent } });
  http.post(__ENV.URL, body, params);
}

function value(metric, key) {
  return metric && metric.values[key] !== undefined ? metric.values[key] : 0;
}

export function handleSummary(data) {
  const m = data.metrics;
  const latency = m.http_req_duration;
  const summary = {
    rate: closedVUs > 0 ? 0 : rate,
    vus: closedVUs,
    duration_s: duration,
    max_vus: closedVUs > 0 ? closedVUs : maxVUs,
    requests: value(m.http_reqs, 'count'),
    failed: value(m.http_req_failed, 'passes'),
    dropped: value(m.dropped_iterations, 'count'),
    p50_ms: value(latency, 'p(50)'),
    p95_ms: value(latency, 'p(95)'),
    p99_ms: value(latency, 'p(99)'),
    max_ms: value(latency, 'max'),
    vus_max: value(m.vus_max, 'value'),
  };
  return { [__ENV.SUMMARY]: JSON.stringify(summary, null, 2) + '\n' };
}
