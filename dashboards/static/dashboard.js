// The dashboard's behaviour: plots drawn from the plot endpoints, HTML fragments swapped in place, and a
// live refresh of both while a study runs — never a full page reload.
"use strict";

const LIVE_STATUSES = ["queued", "running", "cancelling"];

function withQuery(url, query) {
  if (!query) return url;
  return url + (url.includes("?") ? "&" : "?") + query;
}

// The headers of a write from a page: the page's form token travels with the sign-in cookie (api/csrf.py).
function writeHeaders(headers) {
  return {...headers, "X-CSRF-Token": document.querySelector("meta[name=csrf-token]").content};
}

// plotly.js (its basic bundle, 1.2 MB) is loaded without blocking the page: the table is usable and the plot
// data is on its way while the browser parses it.
const plotlyLoaded = new Promise((resolve, reject) => {
  if (!document.querySelector("[data-src]")) return resolve();
  const script = document.createElement("script");
  script.src = document.body.dataset.plotlySrc;
  script.onload = resolve;
  script.onerror = () => reject(new Error("plotly.js could not be loaded"));
  document.head.append(script);
});

async function drawPlot(element) {
  const response = await fetch(element.dataset.src, {headers: {Accept: "application/json"}});
  if (!response.ok) {
    element.textContent = `could not load this plot: ${response.status} ${await response.text()}`;
    element.dataset.ready = "error";
    return;
  }
  const body = await response.json();
  await plotlyLoaded;
  // Each plot is drawn in a task of its own: plots whose data arrived together would otherwise be drawn in
  // one long task, and a click on the page would wait for all of them.
  await new Promise(resolve => setTimeout(resolve));
  const config = {responsive: true, displaylogo: false};
  await Plotly.react(element, body.figure.data, body.figure.layout, config);
  element.dataset.ready = "true";
  element.dataset.readyMs = element.dataset.readyMs || String(performance.now());  // first drawn (benchmarks)
  element.dataset.loads = String(Number(element.dataset.loads || 0) + 1);
}

async function swapFragment(element) {
  const response = await fetch(withQuery(element.dataset.fragment, element.dataset.query));
  if (!response.ok) return;
  element.innerHTML = await response.text();
  element.dataset.ready = "true";
  element.dataset.loads = String(Number(element.dataset.loads || 0) + 1);
  element.dispatchEvent(new CustomEvent("fragment-swapped"));
}

function pageIsLive() {
  if (document.body.dataset.alwaysLive === "true") return true;
  const statuses = [...document.querySelectorAll("[data-status]")].map(e => e.dataset.status);
  return statuses.some(s => LIVE_STATUSES.includes(s));
}

async function refresh(live) {
  const selector = live ? "[data-live]" : "";
  const fragments = [...document.querySelectorAll(`[data-fragment]${selector}`)];
  const plots = [...document.querySelectorAll(`[data-src]${selector}`)];
  await Promise.all([...fragments.map(swapFragment), ...plots.map(drawPlot)]);
}

function startLiveRefresh() {
  const period = Number(document.body.dataset.refreshMs || 5000);
  let wasLive = pageIsLive();
  const tick = async () => {
    if (!wasLive) return;
    await refresh(true);
    wasLive = pageIsLive();  // one last refresh after the study ends shows its final state
    document.body.dataset.refreshes = String(Number(document.body.dataset.refreshes || 0) + 1);
    document.body.dataset.live = String(wasLive);
    if (wasLive) setTimeout(tick, period);
  };
  document.body.dataset.live = String(wasLive);
  if (wasLive) setTimeout(tick, period);
}

// Links inside a fragment that carry data-query (sorting, paging) reload just that fragment.
document.addEventListener("click", event => {
  const link = event.target.closest("a[data-query]");
  const holder = link && link.closest("[data-fragment]");
  if (!holder) return;
  event.preventDefault();
  holder.dataset.query = link.dataset.query;
  swapFragment(holder);
});

// Filter forms (data-filters="ID") set the query of the fragment they filter.
document.addEventListener("change", event => {
  const choice = event.target.closest("select[data-plot]");
  if (choice) {  // a plot option (an axis, an evaluator, a family) redraws that plot
    const plot = document.getElementById(choice.dataset.plot);
    plot.dataset.src = withQuery(choice.dataset.base, `${choice.name}=${encodeURIComponent(choice.value)}`);
    drawPlot(plot);
    return;
  }
  const form = event.target.closest("form[data-filters]");
  if (!form) return;
  const holder = document.getElementById(form.dataset.filters);
  holder.dataset.query = new URLSearchParams(new FormData(form)).toString();
  swapFragment(holder);
});
document.addEventListener("submit", event => {
  if (event.target.matches("form[data-filters]")) event.preventDefault();
});

document.addEventListener("DOMContentLoaded", async () => {
  // Signed in on a server with private reads: the session cookie itself is HttpOnly, this one says it exists.
  if (document.cookie.split("; ").includes("lmt_signed_in=1")) {
    document.querySelector("form.session")?.removeAttribute("hidden");
  }
  // Slow aggregates (data-deferred) are asked for once the rest is drawn, so they never hold up the page.
  await Promise.all([...document.querySelectorAll("[data-src]:not([data-deferred])")].map(drawPlot));
  document.body.dataset.interactiveMs = String(performance.now());
  await Promise.all([...document.querySelectorAll("[data-src][data-deferred]")].map(drawPlot));
  document.body.dataset.ready = "true";
  document.body.dataset.readyMs = String(performance.now());
  startLiveRefresh();
});
