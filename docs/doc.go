// Package docs holds nftproxy's documentation (the Markdown files beside
// this one) and the tests that keep parts of it true to the code.
package docs
