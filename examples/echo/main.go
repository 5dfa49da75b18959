// Command echo serves the example API with echo and the rate limiter.
//
//	go run ./examples/echo
//
// See examples/internal/demo for the limits.
package main

import (
	"net/http"

	"github.com/labstack/echo/v4"

	echoratelimit "github.com/slidinglog/ratelimit/adapters/echo"
	"github.com/slidinglog/ratelimit/examples/internal/demo"
)

func main() {
	app := demo.Start()
	e := echo.New()
	e.HideBanner = true
	e.Use(echoratelimit.Middleware(app.API)) // POST /login's own limit is in app.API's route table
	e.GET("/users/:id", func(c echo.Context) error {
		return c.String(http.StatusOK, "user "+c.Param("id")+"\n")
	})
	e.POST("/login", func(c echo.Context) error {
		return c.String(http.StatusOK, "welcome\n")
	})
	e.GET("/report", func(c echo.Context) error {
		return c.String(http.StatusOK, "an expensive report\n")
	})
	app.Serve(e)
}
