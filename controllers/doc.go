// Package controllers will hold the RateLimitPolicy reconciler that renders
// policies into the sidecar ConfigMap; it comes with issue 4.
package controllers
