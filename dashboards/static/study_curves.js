// The study page's learning curves: ticked trials in the table choose them; the choice survives table refreshes.
"use strict";

document.addEventListener("DOMContentLoaded", () => {
  const picked = new Set();
  const curves = document.getElementById("curves");
  const table = document.getElementById("trials");
  table.addEventListener("change", event => {
    if (!event.target.matches("input[data-curve]")) return;
    const id = event.target.value;
    event.target.checked ? picked.add(id) : picked.delete(id);
    const query = [...picked].map(i => `trial_id=${i}`).join("&");
    curves.dataset.src = query ? `${curves.dataset.base}?${query}` : curves.dataset.base;
    drawPlot(curves);
  });
  table.addEventListener("fragment-swapped", () => {
    table.querySelectorAll("input[data-curve]").forEach(box => { box.checked = picked.has(box.value); });
  });
});
