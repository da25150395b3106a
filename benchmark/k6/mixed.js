// A producer's day: of every 10 iterations, 6 submit a job, 3 read back the status of a job
// this VU submitted, 1 submits a batch of BATCH_SIZE (default 10). RATE iterations per second
// for DURATION, held to the same objective as submit.js.
//   k6 run -e RATE=200 -e DURATION=60s benchmark/k6/mixed.js   (or `make k6 SCRIPT=mixed`)
import exec from "k6/execution";
import { constantArrival, status, submit, submitBatch } from "./lib.js";

const BATCH_SIZE = Number(__ENV.BATCH_SIZE || 10);

export const options = constantArrival("mixed");

const submitted = []; // per VU: ids to read back

export default function () {
  const slot = exec.scenario.iterationInTest % 10;
  if (slot === 9) {
    submitBatch(BATCH_SIZE);
  } else if (slot >= 6 && submitted.length > 0) {
    status(submitted[Math.floor(Math.random() * submitted.length)]);
  } else {
    const id = submit();
    if (id !== null && submitted.length < 100) {
      submitted.push(id);
    }
  }
}
