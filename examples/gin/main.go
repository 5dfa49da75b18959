// Command gin serves the example API with gin and the rate limiter.
//
//	go run ./examples/gin
//
// See examples/internal/demo for the limits.
package main

import (
	"net/http"

	"github.com/gin-gonic/gin"

	ginratelimit "github.com/slidinglog/ratelimit/adapters/gin"
	"github.com/slidinglog/ratelimit/examples/internal/demo"
)

func main() {
	app := demo.Start()
	api, login := app.API, app.Login

	gin.SetMode(gin.ReleaseMode)
	g := gin.New()
	g.Use(ginratelimit.Middleware(api)) // before the routes, as gin requires
	g.GET("/users/:id", func(c *gin.Context) {
		c.String(http.StatusOK, "user %s\n", c.Param("id"))
	})
	g.POST("/login", ginratelimit.Route(login), func(c *gin.Context) {
		c.String(http.StatusOK, "welcome\n")
	})
	g.GET("/report", func(c *gin.Context) {
		c.String(http.StatusOK, "an expensive report\n")
	})
	app.Serve(g)
}
