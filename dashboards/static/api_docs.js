// Swagger UI at /docs with the settings FastAPI gives it, read from the page (api/docs.py), so that the page
// itself holds no script.
"use strict";

const holder = document.getElementById("swagger-ui");
window.ui = SwaggerUIBundle({
  ...JSON.parse(holder.dataset.parameters),
  url: holder.dataset.openapiUrl,
  oauth2RedirectUrl: window.location.origin + holder.dataset.oauth2RedirectUrl,
  presets: [SwaggerUIBundle.presets.apis, SwaggerUIBundle.SwaggerUIStandalonePreset],
});
