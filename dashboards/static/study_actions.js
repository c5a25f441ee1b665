// The study page's Cancel and Resume buttons: POST /studies/{name}/cancel and /resume with the signed-in token
// (the session cookie), each enabled only in the statuses that allow it, and only for a visitor who may write (the page
// says why not otherwise).
"use strict";

const ACTIONS = {cancel: ["queued", "running"], resume: ["failed", "cancelled"]};

function studyStatus() {
  return document.querySelector("#facts [data-status]")?.dataset.status;
}

function enableActions(holder) {
  const status = studyStatus();
  const mayWrite = holder.dataset.mayWrite === "true";
  for (const button of holder.querySelectorAll("button[data-action]")) {
    button.disabled = !mayWrite || !ACTIONS[button.dataset.action].includes(status);
  }
}

async function act(holder, button) {
  const note = holder.querySelector("[role=status]");
  button.disabled = true;
  const response = await fetch(`/studies/${encodeURIComponent(holder.dataset.study)}/${button.dataset.action}`,
                               {method: "POST", headers: writeHeaders({Accept: "application/json"})});
  if (response.status === 401) {
    note.replaceChildren("this server needs a token: ", Object.assign(document.createElement("a"), {
      href: `/dashboard/sign-in?next=${encodeURIComponent(location.pathname)}`, textContent: "sign in"}));
  } else {
    const body = await response.json();
    note.textContent = response.ok ? `${button.dataset.action} requested` : String(body.detail);
  }
  const facts = document.getElementById("facts");
  await swapFragment(facts);  // dashboard.js: the status the action left
  if (document.body.dataset.live !== "true") startLiveRefresh();  // a resumed study runs again: follow it
}

document.addEventListener("DOMContentLoaded", () => {
  const holder = document.getElementById("study-actions");
  enableActions(holder);
  document.getElementById("facts").addEventListener("fragment-swapped", () => enableActions(holder));
  holder.addEventListener("click", event => {
    const button = event.target.closest("button[data-action]");
    if (button) act(holder, button);
  });
});
