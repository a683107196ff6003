package httproute

import (
	"fmt"
	"net/http"
	"reflect"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3gen"
)

// OpenAPIVersion is the version of the documents this package builds
// (kin-openapi's schema generator emits 3.0 nullable schemas).
const OpenAPIVersion = "3.0.3"

// UnknownVersion is info.version for a service that does not know its own
// version (a binary built without version stamping or VCS information).
// OpenAPI requires a non-empty info.version; "NA" is upstream's
// placeholder for an unknown part of its version string ("NA-NA").
const UnknownVersion = "NA"

var pathParam = regexp.MustCompile(`\{([A-Za-z0-9_]+)\}`)

// ValidationItem documents one entry of FastAPI's 422 list (the services'
// own item types marshal to this shape, some with more fields).
type ValidationItem struct {
	Loc  []any  `json:"loc"`
	Msg  string `json:"msg"`
	Type string `json:"type"`
}

// ValidationBody documents a 422 body.
type ValidationBody struct {
	Detail []ValidationItem `json:"detail"`
}

// OpenAPI builds the document from the table. Every operation has a schema
// for each documented response (JSON from the Go type, strings for text and
// binary bodies) and, where the route reads one, for its request body.
func (t *Table) OpenAPI() (*openapi3.T, error) {
	version := strings.TrimSpace(t.cfg.Version)
	if version == "" {
		version = UnknownVersion
	}
	doc := &openapi3.T{
		OpenAPI: OpenAPIVersion,
		Info:    &openapi3.Info{Title: t.cfg.Title, Version: version},
		Paths:   openapi3.NewPaths(),
		Components: &openapi3.Components{
			SecuritySchemes: openapi3.SecuritySchemes{
				"bearer": &openapi3.SecuritySchemeRef{Value: &openapi3.SecurityScheme{Type: "http", Scheme: "bearer"}},
			},
		},
	}
	for i := range t.routes {
		rt := &t.routes[i]
		if rt.Hidden {
			continue
		}
		op, err := t.operation(rt)
		if err != nil {
			return nil, fmt.Errorf("httproute: %s: %w", rt.Pattern(), err)
		}
		item := doc.Paths.Value(rt.Path)
		if item == nil {
			item = &openapi3.PathItem{}
			doc.Paths.Set(rt.Path, item)
		}
		item.SetOperation(rt.Method, op)
	}
	return doc, nil
}

func (t *Table) operation(rt *Route) (*openapi3.Operation, error) {
	op := &openapi3.Operation{
		Summary:     rt.Summary,
		OperationID: OperationID(rt.Method, rt.Path),
		Responses:   openapi3.NewResponses(),
	}
	if rt.Tag != "" {
		op.Tags = []string{rt.Tag}
	}
	for _, m := range pathParam.FindAllStringSubmatch(rt.Path, -1) {
		op.AddParameter(openapi3.NewPathParameter(m[1]).WithSchema(openapi3.NewStringSchema()))
	}
	for _, q := range rt.Query {
		op.AddParameter(openapi3.NewQueryParameter(q.Name).WithRequired(q.Required).WithSchema(paramSchema(q)))
	}
	if rt.Request != nil {
		ct := rt.RequestType
		if ct == "" {
			ct = JSON
		}
		s, err := schemaFor(rt.Request, ct)
		if err != nil {
			return nil, err
		}
		op.RequestBody = &openapi3.RequestBodyRef{Value: openapi3.NewRequestBody().WithRequired(true).
			WithContent(openapi3.NewContentWithSchemaRef(s, []string{ct}))}
	}
	codes := make([]int, 0, len(rt.Statuses))
	for c := range rt.Statuses {
		codes = append(codes, c)
	}
	sort.Ints(codes)
	// NewResponses seeds a "default"; the table documents every status.
	op.Responses.Delete("default")
	for _, code := range codes {
		resp := openapi3.NewResponse().WithDescription(rt.Statuses[code])
		ct, body := t.bodyOf(rt, code)
		if body != nil || ct != "" {
			s, err := schemaFor(body, ct)
			if err != nil {
				return nil, err
			}
			resp.WithContent(openapi3.NewContentWithSchemaRef(s, []string{ct}))
		}
		op.AddResponse(code, resp)
	}
	if rt.Auth == Bearer && (t.cfg.Token != "" || t.cfg.DocumentSecurityAlways) {
		op.Security = &openapi3.SecurityRequirements{openapi3.NewSecurityRequirement().Authenticate("bearer")}
	}
	return op, nil
}

// bodyOf is the content type and a value of the body type of one response
// ("" and nil: no body, as for 204).
func (t *Table) bodyOf(rt *Route, code int) (string, any) {
	if code == http.StatusNoContent {
		return "", nil
	}
	if code < 300 {
		ct := rt.Produces
		if ct == "" {
			ct = JSON
		}
		if rt.Response == nil {
			if ct == JSON {
				return ct, map[string]any{}
			}
			return ct, ""
		}
		return ct, rt.Response
	}
	if code == http.StatusUnprocessableEntity {
		return JSON, ValidationBody{}
	}
	sh := rt.Shape
	if o, ok := rt.StatusShapes[code]; ok {
		sh = o
	}
	if code == http.StatusInternalServerError && t.cfg.Errors.HideInternal {
		sh = ShapeText
	}
	switch sh {
	case ShapeError:
		return JSON, ErrorBody{}
	case ShapeText:
		return Text, ""
	}
	return JSON, DetailBody{}
}

func paramSchema(q Param) *openapi3.Schema {
	var s *openapi3.Schema
	switch q.Type {
	case "integer":
		s = openapi3.NewIntegerSchema()
	case "boolean":
		s = openapi3.NewBoolSchema()
	case "number":
		s = openapi3.NewFloat64Schema()
	default:
		s = openapi3.NewStringSchema()
	}
	for _, e := range q.Enum {
		s.Enum = append(s.Enum, e)
	}
	s.Default = q.Default
	s.Min, s.Max = q.Min, q.Max
	return s
}

// schemaFor generates the schema of v's Go type. Text and binary bodies
// are strings whatever v is.
func schemaFor(v any, contentType string) (*openapi3.SchemaRef, error) {
	switch {
	case contentType == Binary:
		return openapi3.NewSchemaRef("", openapi3.NewStringSchema().WithFormat("binary")), nil
	case strings.HasPrefix(contentType, "text/"):
		return openapi3.NewSchemaRef("", openapi3.NewStringSchema()), nil
	}
	s, err := openapi3gen.NewSchemaRefForValue(v, nil, openapi3gen.SchemaCustomizer(requireFields))
	if err != nil {
		return nil, err
	}
	if s.Value != nil && s.Value.Type == nil && reflect.TypeOf(v).Kind() == reflect.Map {
		s.Value.Type = &openapi3.Types{openapi3.TypeObject}
	}
	return s, nil
}

// requireFields marks struct fields without omitempty as required and
// reads a field's `enum:"a,b"`, `maxLength:"n"` (bytes, as the services
// bound names) and `doc:"..."` tags.
func requireFields(name string, t reflect.Type, tag reflect.StructTag, s *openapi3.Schema) error {
	if e := tag.Get("enum"); e != "" {
		for _, v := range strings.Split(e, ",") {
			s.Enum = append(s.Enum, v)
		}
	}
	if m := tag.Get("maxLength"); m != "" {
		n, err := strconv.ParseUint(m, 10, 64)
		if err != nil {
			return fmt.Errorf("field %s: maxLength tag %q: %w", name, m, err)
		}
		s.MaxLength = &n
	}
	if d := tag.Get("doc"); d != "" {
		s.Description = d
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct || len(s.Properties) == 0 {
		return nil
	}
	for i := range t.NumField() {
		f := t.Field(i)
		j := f.Tag.Get("json")
		if j == "" || j == "-" || !f.IsExported() {
			continue
		}
		n, opts, _ := strings.Cut(j, ",")
		if n == "" || strings.Contains(opts, "omitempty") || strings.Contains(opts, "omitzero") || f.Type.Kind() == reflect.Pointer {
			continue
		}
		if _, ok := s.Properties[n]; ok {
			s.Required = append(s.Required, n)
		}
	}
	return nil
}

// OperationID is the operationId of a method and path
// ("get_quota_cache_salt").
func OperationID(method, path string) string {
	p := strings.NewReplacer("/", "_", "{", "", "}", "", "-", "_", ".", "_").Replace(path)
	return strings.ToLower(method) + strings.TrimSuffix(p, "_")
}

// ServeOpenAPI is a handler for GET /openapi.json (the document New
// built).
func (t *Table) ServeOpenAPI(w http.ResponseWriter, _ *http.Request) error {
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(t.doc)
	return nil
}

// FreeFormBodies lists the operations of doc whose JSON request or
// response body is a free-form object (no properties, any members: what
// map[string]any generates), as "METHOD /path request" or
// "METHOD /path <status>", sorted. A service's test compares it with the
// short list of bodies it means to leave untyped, so a new untyped route
// fails until it is typed or named there.
func FreeFormBodies(doc *openapi3.T) []string {
	var out []string
	for path, item := range doc.Paths.Map() {
		for method, op := range item.Operations() {
			if op.RequestBody != nil && op.RequestBody.Value != nil {
				if mt := op.RequestBody.Value.Content.Get(JSON); mt != nil && freeForm(mt.Schema) {
					out = append(out, method+" "+path+" request")
				}
			}
			for code, resp := range op.Responses.Map() {
				if resp.Value == nil {
					continue
				}
				if mt := resp.Value.Content.Get(JSON); mt != nil && freeForm(mt.Schema) {
					out = append(out, method+" "+path+" "+code)
				}
			}
		}
	}
	sort.Strings(out)
	return out
}

// freeForm reports whether s is an object schema without properties whose
// members may be anything.
func freeForm(s *openapi3.SchemaRef) bool {
	if s == nil || s.Value == nil {
		return false
	}
	v := s.Value
	if v.Type == nil || !v.Type.Is(openapi3.TypeObject) || len(v.Properties) > 0 {
		return false
	}
	ap := v.AdditionalProperties.Schema
	return ap == nil || ap.Value == nil || ap.Value.Type == nil
}
