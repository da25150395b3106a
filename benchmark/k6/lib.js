// Settings shared by the jobq k6 scripts, all from the environment (`k6 run -e NAME=value`):
//   BASE_URL  the producer (default http://127.0.0.1:8080)
//   API_KEY   a submit or admin key when the producer requires one (JOBQ_API_KEYS)
//   RATE      requests per second (default 50); DURATION as k6 reads it (default 30s)
//   QUEUE     the queue jobs go to (default "default"); TASK_TYPE (default "noop")
//   MAX_VUS   cap on requests in flight (default RATE / 2, at least 20: by Little's law enough
//             for every request to take 500 ms, twice the objective; a slower server makes k6
//             drop iterations, which the dropped_iterations threshold counts, instead of piling
//             up connections until it collapses)
import http from "k6/http";
import { check } from "k6";

export const BASE_URL = (__ENV.BASE_URL || "http://127.0.0.1:8080").replace(/\/$/, "");
export const RATE = Number(__ENV.RATE || 50);
export const DURATION = __ENV.DURATION || "30s";
export const QUEUE = __ENV.QUEUE || "default";
export const TASK_TYPE = __ENV.TASK_TYPE || "noop";
export const MAX_VUS = Number(__ENV.MAX_VUS || Math.max(20, Math.ceil(RATE / 2)));

// The service objective every script is held to (k6 exits 99 when one is broken), plus the
// load itself: at most 1 % of the scheduled iterations may be dropped for want of a free VU, so
// a run that did not deliver its rate cannot pass.
export const THRESHOLDS = {
  http_req_duration: ["p(95)<250"],
  http_req_failed: ["rate<0.01"],
};
export function deliveredRate(rate) {
  return { dropped_iterations: [`rate<${rate / 100}`] };
}
export const SUMMARY_TREND_STATS = ["avg", "min", "med", "p(90)", "p(95)", "p(99)", "max"];

// Options of an open-loop run: RATE iterations per second for DURATION in scenario `name`,
// held to THRESHOLDS. k6 starts each iteration on schedule whatever the previous ones did, and
// counts `dropped_iterations` when MAX_VUS are all busy.
export function constantArrival(name) {
  return {
    scenarios: {
      [name]: {
        executor: "constant-arrival-rate",
        rate: RATE,
        timeUnit: "1s",
        duration: DURATION,
        preAllocatedVUs: Math.min(MAX_VUS, Math.max(10, Math.ceil(RATE / 10))),
        maxVUs: MAX_VUS,
      },
    },
    thresholds: { ...THRESHOLDS, ...deliveredRate(RATE) },
    summaryTrendStats: SUMMARY_TREND_STATS,
  };
}

const HEADERS = { "Content-Type": "application/json" };
if (__ENV.API_KEY) {
  HEADERS.Authorization = `Bearer ${__ENV.API_KEY}`;
}

export function job(extra) {
  return { taskType: TASK_TYPE, queue: QUEUE, payload: { vu: __VU, iteration: __ITER, ...extra } };
}

// POST /jobs; returns the new job's id, or null when it was not accepted.
export function submit(tags) {
  const reply = http.post(`${BASE_URL}/jobs`, JSON.stringify(job({})), {
    headers: HEADERS,
    tags: { name: "POST /jobs", ...tags },
  });
  const accepted = check(reply, { "submit: 202": (r) => r.status === 202 });
  return accepted ? reply.json("jobId") : null;
}

// POST /jobs/batch with `size` jobs; true when every entry was accepted.
export function submitBatch(size, tags) {
  const jobs = Array.from({ length: size }, (_, index) => job({ index }));
  const reply = http.post(`${BASE_URL}/jobs/batch`, JSON.stringify({ jobs }), {
    headers: HEADERS,
    tags: { name: "POST /jobs/batch", ...tags },
  });
  return check(reply, {
    "batch: 200": (r) => r.status === 200,
    "batch: every entry 202": (r) => r.status === 200 && r.json("results").every((e) => e.status === 202),
  });
}

// GET /jobs/{id}; true when the job was found.
export function status(jobId, tags) {
  const reply = http.get(`${BASE_URL}/jobs/${jobId}`, {
    headers: HEADERS,
    tags: { name: "GET /jobs/{id}", ...tags },
  });
  return check(reply, { "status: 200": (r) => r.status === 200 });
}
