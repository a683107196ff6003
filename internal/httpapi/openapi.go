package httpapi

import (
	"net/http"
	"regexp"
	"strconv"
	"strings"
)

var pathParam = regexp.MustCompile(`\{([a-z_]+)\}`)

// OpenAPI builds the OpenAPI 3 document from the route table.
func (s *Server) OpenAPI() map[string]any {
	paths := map[string]any{}
	for _, rt := range routes() {
		item, _ := paths[rt.path].(map[string]any)
		if item == nil {
			item = map[string]any{}
			paths[rt.path] = item
		}
		var params []map[string]any
		for _, m := range pathParam.FindAllStringSubmatch(rt.path, -1) {
			params = append(params, map[string]any{"name": m[1], "in": "path", "required": true, "schema": map[string]any{"type": "string"}})
		}
		for _, q := range rt.query {
			params = append(params, map[string]any{"name": q, "in": "query", "required": false, "schema": map[string]any{"type": "string"}})
		}
		responses := map[string]any{}
		ct := rt.produces
		if ct == "" {
			ct = ctJSON
		}
		for code, desc := range rt.statuses {
			resp := map[string]any{"description": desc}
			if code < 300 {
				resp["content"] = map[string]any{ct: map[string]any{}}
			}
			responses[strconv.Itoa(code)] = resp
		}
		op := map[string]any{
			"summary":     rt.summary,
			"operationId": operationID(rt),
			"tags":        []string{rt.tag},
			"responses":   responses,
		}
		if len(params) > 0 {
			op["parameters"] = params
		}
		if rt.body != "" {
			op["requestBody"] = map[string]any{"content": map[string]any{rt.body: map[string]any{}}}
		}
		if rt.auth != authOpen {
			op["security"] = []map[string]any{{"bearer": []string{}}}
		}
		item[strings.ToLower(rt.method)] = op
	}
	return map[string]any{
		"openapi": "3.0.3",
		"info": map[string]any{
			"title":   "LMCache HTTP API",
			"version": s.opts.Version,
		},
		"paths": paths,
		"components": map[string]any{
			"securitySchemes": map[string]any{"bearer": map[string]any{"type": "http", "scheme": "bearer"}},
		},
	}
}

func operationID(rt route) string {
	p := strings.NewReplacer("/", "_", "{", "", "}", "", "-", "_").Replace(rt.path)
	return strings.ToLower(rt.method) + strings.TrimSuffix(p, "_")
}

func (s *Server) handleOpenAPI(w http.ResponseWriter, _ *http.Request) error {
	writeJSON(w, http.StatusOK, s.OpenAPI())
	return nil
}
