// Single submits (POST /jobs) at a constant arrival rate: RATE per second for DURATION, held
// to p95 < 250 ms and < 1% failed requests (lib.js says how the run is shaped).
//   k6 run -e RATE=800 -e DURATION=60s benchmark/k6/submit.js     (or `make k6`)
import { constantArrival, submit } from "./lib.js";

export const options = constantArrival("submit");

export default function () {
  submit();
}
