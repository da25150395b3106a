// Find the knee: single submits at an arrival rate that climbs in STEPS equal steps (default
// 5) of STEP (default 20s) each up to PEAK per second (default 1000). Every request is tagged
// with its step's target rate, and each step gets its own p95 line in the summary
// (`http_req_duration{target:<rate>}`): the knee is the first step whose p95 passes 250 ms or
// that drops iterations. Thresholds do not abort the run, so every step is measured.
//   k6 run -e PEAK=1200 -e STEP=30s benchmark/k6/burst.js     (or `make k6 SCRIPT=burst`)
import { SUMMARY_TREND_STATS, THRESHOLDS, submit } from "./lib.js";

const PEAK = Number(__ENV.PEAK || 1000);
const STEPS = Number(__ENV.STEPS || 5);
const STEP = __ENV.STEP || "20s";
const STEP_SECONDS = Number(STEP.replace(/s$/, ""));
const MAX_VUS = Number(__ENV.MAX_VUS || Math.max(20, Math.ceil(PEAK / 2)));
const TARGETS = Array.from({ length: STEPS }, (_, index) => Math.round((PEAK * (index + 1)) / STEPS));

const perStep = {};
for (const target of TARGETS) {
  perStep[`http_req_duration{target:${target}}`] = ["p(95)<250"];
}

export const options = {
  scenarios: {
    burst: {
      executor: "ramping-arrival-rate",
      startRate: TARGETS[0],
      timeUnit: "1s",
      preAllocatedVUs: Math.min(MAX_VUS, 50),
      maxVUs: MAX_VUS,
      // Each step: a quick ramp to its target, then a hold at it.
      stages: TARGETS.flatMap((target) => [
        { target, duration: "1s" },
        { target, duration: `${Math.max(1, STEP_SECONDS - 1)}s` },
      ]),
    },
  },
  thresholds: { ...THRESHOLDS, ...perStep },
  summaryTrendStats: SUMMARY_TREND_STATS,
};

export function setup() {
  return { started: Date.now() };
}

export default function (data) {
  const elapsed = (Date.now() - data.started) / 1000;
  const index = Math.min(STEPS - 1, Math.floor(elapsed / STEP_SECONDS));
  submit({ target: String(TARGETS[index]) });
}
