// The "New study" page: a YAML editor (CodeMirror 5, vendored) prefilled from a shipped space, checked by
// POST /studies/validate as the user types, planned by POST /studies/plan and submitted to POST /studies.
// The session cookie of the sign-in page carries the token: every request here is same-origin.
"use strict";

const CHECK_DELAY_MS = 400;  // the editor asks for a check once typing pauses this long

function element(tag, attributes = {}, ...children) {
  const made = document.createElement(tag);
  for (const [name, value] of Object.entries(attributes)) made.setAttribute(name, value);
  made.append(...children);  // text is added as text: messages quote what the user typed
  return made;
}

function issueText(issue) {
  return issue.field ? `${issue.field}: ${issue.message}` : issue.message;
}

async function postSpec(url, text) {
  const response = await fetch(url, {method: "POST", body: text,
                                     headers: writeHeaders({"Content-Type": "application/yaml", Accept: "application/json"})});
  const body = response.headers.get("content-type")?.includes("json") ? await response.json() : await response.text();
  return {status: response.status, body};
}

function refusal(result) {
  if (result.status === 401) return "this server needs a token: sign in first";
  return typeof result.body === "string" ? `${result.status}: ${result.body}` : String(result.body.detail);
}

// Problems listed under the editor, each linked to its line; those without a line concern the whole document.
function showIssues(editor, issues, state) {
  const holder = document.getElementById("issues");
  holder.dataset.state = state;
  if (!issues.length) {
    holder.replaceChildren(element("p", {class: "state-COMPLETE"}, "no problems: POST /studies would accept it"));
    return;
  }
  const items = issues.map(issue => {
    const where = issue.line ? element("a", {href: "#", "data-line": issue.line}, `line ${issue.line}`) : "document";
    return element("li", {"data-line": issue.line ?? ""}, where, ": ", issueText(issue));
  });
  holder.replaceChildren(
    element("p", {class: "error"}, `${issues.length} problem${issues.length === 1 ? "" : "s"}:`),
    element("ul", {}, ...items));
  holder.querySelectorAll("a[data-line]").forEach(link => link.addEventListener("click", event => {
    event.preventDefault();
    editor.setCursor({line: Number(link.dataset.line) - 1, ch: 0});
    editor.focus();
  }));
}

function annotations(editor, issues) {
  return issues.filter(issue => issue.line).map(issue => {
    const line = Math.min(issue.line, editor.lineCount()) - 1;
    return {from: CodeMirror.Pos(line, 0), to: CodeMirror.Pos(line, editor.getLine(line).length),
            message: issueText(issue), severity: "error"};
  });
}

function markLines(editor, issues) {
  for (let line = 0; line < editor.lineCount(); line++) editor.removeLineClass(line, "background", "has-issue");
  for (const issue of issues) {
    if (issue.line) editor.addLineClass(Math.min(issue.line, editor.lineCount()) - 1, "background", "has-issue");
  }
}

let latestCheck = 0;

async function checkSpec(text, updateLinting, _options, editor) {
  const mine = ++latestCheck;
  let issues, state;
  try {
    const result = await postSpec("/studies/validate", text);
    if (result.status === 200 || result.status === 422) {
      issues = result.status === 200 ? [] : result.body.detail;
      state = result.status === 200 ? "valid" : "invalid";
    } else {
      issues = [{field: "", message: refusal(result), line: null}];
      state = "error";
    }
  } catch (error) {
    issues = [{field: "", message: `could not check the spec: ${error.message}`, line: null}];
    state = "error";
  }
  if (mine !== latestCheck) return;  // the text changed meanwhile: a newer check answers
  showIssues(editor, issues, state);
  markLines(editor, issues);
  updateLinting(annotations(editor, issues));
}

function duration(seconds) {  // as `tuner plan` prints it (duration in tuner/spec/cost.py)
  const day = 86400;
  if (seconds < 60) return seconds < 10 ? `${seconds.toFixed(1)} s` : `${seconds.toFixed(0)} s`;
  if (seconds < 3600) return `${(seconds / 60).toFixed(0)} min`;
  if (seconds < 2 * day) return `${(seconds / 3600).toFixed(1)} h`;
  if (seconds < 10 * day) return `${(seconds / day).toFixed(1)} days`;
  if (seconds < 365 * day) return `${Math.round(seconds / day).toLocaleString("en-US")} days`;
  return `${(seconds / day / 365).toLocaleString("en-US", {maximumFractionDigits: 1})} years`;
}

const count = n => n.toLocaleString("en-US");
const share = (part, total) => `${Math.round(100 * part / total)}%`;

function familyTable(family) {
  const rows = [["trials", `${family.trials} (+${family.runs - family.trials} reruns)`],
                ["sampled configurations", `${family.sampled_points} (${family.infeasible_points} over the budget)`]];
  if (family.hidden_size) {
    const hidden = family.hidden_size, parts = family.parameters;
    rows.push(["hidden size min / median / max", `${count(hidden.min)} / ${count(hidden.median)} / ${count(hidden.max)}`],
              ["embedding size (median shape)", count(family.embedding_size)]);
    for (const part of ["embedding", "recurrent", "softmax"]) {
      rows.push([`${part} parameters`, `${count(parts[part])} (${share(parts[part], parts.total)})`]);
    }
    rows.push(["total parameters", count(parts.total)]);
  }
  if (family.estimate) {
    const estimate = family.estimate;
    rows.push(["training step", `${(estimate.step_seconds * 1000).toFixed(1)} ms`],
              ["evaluation per turn", `${estimate.evaluation_seconds.toFixed(2)} s`],
              ["turns per trial", count(estimate.turns)],
              ["time per trial", `${duration(estimate.trial_seconds)} (${share(estimate.evaluation_share, 1)} evaluating)`]);
  }
  return element("table", {"data-family": family.family},
                 element("caption", {}, `family ${family.family}`),
                 element("tbody", {}, ...rows.map(([name, value]) => element("tr", {}, element("th", {}, name),
                                                                             element("td", {class: "num"}, value)))));
}

function showPlan(plan) {
  const families = plan.families.length;
  const parts = [element("p", {}, element("b", {}, plan.study),
                         `: ${families} famil${families === 1 ? "y" : "ies"} at ${count(plan.parameter_budget)} ` +
                         `parameters, vocabulary ${count(plan.vocab_size)}`),
                 ...plan.families.map(familyTable)];
  if (plan.estimate) {
    const e = plan.estimate, runs = plan.families.reduce((sum, f) => sum + f.runs, 0);
    parts.push(element("p", {id: "plan-estimate"}, `study: ${runs} runs, about `, element("b", {}, duration(e.study_seconds)),
                       ` with ${e.parallel_trials} at a time on this server (${e.device}, ${e.threads} thread(s) per ` +
                       `trial; probe ${e.probe_seconds.toFixed(1)} s; not included: ${e.not_included.join(", ")})`));
  }
  if (plan.cost) {  // the whole study's GPU-hours or core-hours, from the probe or a FLOP count: over a day stands out
    parts.push(element("p", {id: "plan-cost", class: plan.cost.over_a_day ? "warning" : ""}, `cost: ${plan.cost.summary}`),
               element("ul", {id: "plan-cost-notes"}, ...plan.cost.notes.map(note => element("li", {}, note))));
  }
  parts.push(element("ul", {id: "plan-notes"}, ...plan.notes.map(note => element("li", {}, `note: ${note}`))));
  parts.push(element("ul", {id: "plan-warnings"},
                     ...plan.warnings.map(w => element("li", {class: "warning"}, `warning: ${w}`))));
  document.getElementById("plan-output").replaceChildren(...parts);
}

async function planStudy(editor) {
  const status = document.getElementById("action-status");
  const probe = document.getElementById("probe").checked;
  status.textContent = probe ? "planning, and timing each family here (about 10 s)…" : "planning…";
  const output = document.getElementById("plan-output");
  output.dataset.state = "planning";
  const result = await postSpec(`/studies/plan?probe=${probe}`, editor.getValue());
  if (result.status === 200) {
    showPlan(result.body);
    status.textContent = "";
  } else if (result.status === 422) {
    showIssues(editor, result.body.detail, "invalid");
    output.replaceChildren();
    status.textContent = "not planned: the spec has problems (listed above)";
  } else {
    output.replaceChildren();
    status.textContent = `not planned: ${refusal(result)}`;
  }
  output.dataset.state = String(result.status);
}

async function submitStudy(editor) {
  const status = document.getElementById("action-status");
  status.textContent = "submitting…";
  const result = await postSpec("/studies", editor.getValue());
  if (result.status === 202) {
    status.textContent = `queued ${result.body.name}`;
    window.location.assign(`/dashboard/studies/${encodeURIComponent(result.body.name)}`);
  } else if (result.status === 422) {
    showIssues(editor, result.body.detail, "invalid");
    status.textContent = "not submitted: the spec has problems (listed above)";
  } else {
    status.textContent = `not submitted: ${refusal(result)}`;
  }
}

async function loadSpace(editor, name) {
  const response = await fetch(`/spaces/${name.split("/").map(encodeURIComponent).join("/")}`);
  if (!response.ok) {
    document.getElementById("space-description").textContent = `could not load ${name}: ${response.status}`;
    return;
  }
  const space = await response.json();
  document.getElementById("space-description").textContent = space.description;
  editor.setValue(space.text);
  editor.markClean();
  document.body.dataset.space = space.name;
}

document.addEventListener("DOMContentLoaded", () => {
  const editor = CodeMirror.fromTextArea(document.getElementById("spec"), {
    mode: "yaml", lineNumbers: true, indentUnit: 2, gutters: ["CodeMirror-lint-markers"],
    extraKeys: {Tab: cm => cm.execCommand("insertSoftTab")},  // YAML refuses tabs
    lint: {getAnnotations: checkSpec, async: true, delay: CHECK_DELAY_MS},
  });
  const choice = document.getElementById("space");
  choice.addEventListener("change", () => {
    if (editor.isClean() || window.confirm(`Replace your edits with ${choice.value}?`)) loadSpace(editor, choice.value);
  });
  document.getElementById("space-form").addEventListener("submit", event => event.preventDefault());
  document.getElementById("plan").addEventListener("click", () => planStudy(editor));
  document.getElementById("submit").addEventListener("click", () => submitStudy(editor));
  loadSpace(editor, choice.value);
});
