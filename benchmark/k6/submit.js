// Single submits (POST /jobs) at a constant arrival rate: RATE per second for DURATION, held
// to p95 < 250 ms and < 1% failed requests. Open loop: k6 starts each request on schedule
// whatever the previous ones did, and counts `dropped_iterations` when it runs out of VUs.
//   k6 run -e RATE=800 -e DURATION=60s benchmark/k6/submit.js     (or `make k6`)
import { DURATION, MAX_VUS, RATE, SUMMARY_TREND_STATS, THRESHOLDS, submit } from "./lib.js";

export const options = {
  scenarios: {
    submit: {
      executor: "constant-arrival-rate",
      rate: RATE,
      timeUnit: "1s",
      duration: DURATION,
      preAllocatedVUs: Math.min(MAX_VUS, Math.max(10, Math.ceil(RATE / 10))),
      maxVUs: MAX_VUS,
    },
  },
  thresholds: THRESHOLDS,
  summaryTrendStats: SUMMARY_TREND_STATS,
};

export default function () {
  submit();
}
