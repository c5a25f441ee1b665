// The sensitivity page's form: queue more runs (POST /studies/{name}/sensitivity) and follow the chosen parameter.
"use strict";

document.addEventListener("DOMContentLoaded", () => {
  const form = document.getElementById("request");
  form.addEventListener("change", () => {
    document.getElementById("sensitivity-status").dataset.query = `parameter=${form.parameter.value}`;
  });
  form.addEventListener("submit", async event => {
    event.preventDefault();
    const body = {parameter: form.parameter.value, seeds: Number(form.seeds.value), points: Number(form.points.value)};
    const response = await fetch(form.dataset.action, {
      method: "POST", headers: writeHeaders({"Content-Type": "application/json"}), body: JSON.stringify(body)});
    const answer = await response.json();
    document.getElementById("request-result").textContent = response.ok
      ? `${answer.queued} run(s) queued: ${answer.family}, ${answer.parameter} at ${answer.values.map(v => v.toPrecision(4)).join(", ")}`
      : `refused: ${JSON.stringify(answer.detail)}`;
  });
});
