package api

import (
	_ "embed"
	"net/http"

	"github.com/labstack/echo/v4"
)

// openAPIDocument is the API's OpenAPI 3.1 description, written by hand.
// openapi_test.go keeps it honest: every route New registers must be in it,
// everything in it must be registered, and real answers must match its
// schemas.
//
//go:embed openapi.json
var openAPIDocument []byte

// openAPI serves the document. It needs no token: it describes the API,
// it reveals nothing about this server's data.
func (s *Server) openAPI(c echo.Context) error {
	return c.Blob(http.StatusOK, echo.MIMEApplicationJSON, openAPIDocument)
}
